// Data sets and models as users keep them: files, directories (recursive), globs, hub ids from a
// fake Hugging Face hub cache, splits by HF file naming, the eval set, streaming reads, the token
// cache's fallback directory, BOMs and non-regular files.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "data/data_files.h"
#include "data/data_job.h"
#include "data/readers.h"
#include "data/token_cache.h"
#include "model/hf_checkpoint.h"
#include "io/hub_cache.h"
#include "model/random_model_dir.h"
#include "parquet_test_writer.h"
#include "test_util.h"
#include "text/tokenizer.h"
#include "train/trainer.h"

namespace qt {
namespace {

namespace fs = std::filesystem;
using testing::ScopedEnv;
using testing::ScratchDir;

void write_file(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// An ultrachat conversation whose texts carry `tag`, so a test can tell which file a sample came from.
nlohmann::json chat_row(const std::string& tag, int i) {
  const std::string q = "question " + tag + " " + std::to_string(i);
  return {{"prompt", q},
          {"prompt_id", tag + std::to_string(i)},
          {"messages", nlohmann::json::array({{{"content", q}, {"role", "user"}},
                                              {{"content", "answer " + tag + " " + std::to_string(i)}, {"role", "assistant"}}})}};
}

std::string chat_jsonl(const std::string& tag, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += nlohmann::json{{"messages", chat_row(tag, i)["messages"]}}.dump() + "\n";
  return s;
}

// Writes a parquet shard the way the hub cache keeps files: a blob under blobs/ and a symlink in
// the snapshot.
void write_hub_shard(const fs::path& repo, const fs::path& snapshot_file, const std::string& tag, int rows) {
  const fs::path blob = repo / "blobs" / (tag + "-" + std::to_string(rows) + "-" + snapshot_file.filename().string());
  fs::create_directories(blob.parent_path());
  std::vector<nlohmann::json> r;
  for (int i = 0; i < rows; ++i) r.push_back(chat_row(tag, i));
  testing::PqWriteOptions o;
  o.codec = 1;
  o.rows_per_group = 3;
  testing::pq_write_file(blob.string(), testing::pq_ultrachat_schema(), r, o);
  fs::create_directories(snapshot_file.parent_path());
  fs::create_symlink(fs::relative(blob, snapshot_file.parent_path()), snapshot_file);
}

constexpr const char* kRev1 = "1111111111111111111111111111111111111111";
constexpr const char* kRev2 = "2222222222222222222222222222222222222222";
constexpr const char* kModelRev = "abcdefabcdefabcdefabcdefabcdefabcdefabcd";

// A hub cache in a scratch directory: ultrachat's four splits at revision 1 (refs/main), a second
// revision (refs/v2) with two train_sft shards, a README and .gitattributes; and models--x--y.
struct FakeHub {
  ScratchDir dir{"fake-hub"};
  ScopedEnv env{"HF_HUB_CACHE", dir.file("hub")};
  fs::path data_repo = fs::path(dir.file("hub")) / "datasets--HuggingFaceH4--ultrachat_200k";
  fs::path model_repo = fs::path(dir.file("hub")) / "models--x--y";
  FakeHub() {
    const fs::path s1 = data_repo / "snapshots" / kRev1, s2 = data_repo / "snapshots" / kRev2;
    write_hub_shard(data_repo, s1 / "data" / "train_sft-00000-of-00002-aaaa.parquet", "train_sft_a", 5);
    write_hub_shard(data_repo, s1 / "data" / "train_sft-00001-of-00002-bbbb.parquet", "train_sft_b", 4);
    write_hub_shard(data_repo, s1 / "data" / "test_sft-00000-of-00001-cccc.parquet", "test_sft", 3);
    write_hub_shard(data_repo, s1 / "data" / "train_gen-00000-of-00001-dddd.parquet", "train_gen", 2);
    write_hub_shard(data_repo, s1 / "data" / "test_gen-00000-of-00001-eeee.parquet", "test_gen", 2);
    write_file((s1 / "README.md").string(), "# ultrachat\n");
    write_file((s1 / ".gitattributes").string(), "*.parquet filter=lfs\n");
    write_hub_shard(data_repo, s2 / "data" / "train_sft-00000-of-00001-ffff.parquet", "rev2", 7);
    write_file((data_repo / "refs" / "main").string(), std::string(kRev1) + "\n");
    write_file((data_repo / "refs" / "v2").string(), kRev2);
    write_random_model_dir("tiny", (model_repo / "snapshots" / kModelRev).string(), 3, DType::F32);
    write_file((model_repo / "refs" / "main").string(), kModelRev);
  }
  std::string snapshot(const char* rev) const { return (data_repo / "snapshots" / rev).string(); }
  std::string model_snapshot() const { return (model_repo / "snapshots" / kModelRev).string(); }
};

std::vector<std::string> names(const std::vector<std::string>& files) {
  std::vector<std::string> out;
  for (const auto& f : files) out.push_back(fs::path(f).filename().string());
  return out;
}

// ---- hub ids -----------------------------------------------------------------------------------

TEST(HubCache, IdShape) {
  EXPECT_TRUE(hub_looks_like_id("Qwen/Qwen3.5-27B"));
  EXPECT_TRUE(hub_looks_like_id("HuggingFaceH4/ultrachat_200k@main"));
  EXPECT_FALSE(hub_looks_like_id("/abs/path"));
  EXPECT_FALSE(hub_looks_like_id("./a/b"));
  EXPECT_FALSE(hub_looks_like_id("~/a"));
  EXPECT_FALSE(hub_looks_like_id("a/b/c"));
  EXPECT_FALSE(hub_looks_like_id("model"));
  EXPECT_FALSE(hub_looks_like_id("a/"));
  EXPECT_FALSE(hub_looks_like_id("a/b@"));
  EXPECT_FALSE(hub_looks_like_id("data/train.jsonl"));  // a missing data file, not a repository
  ScratchDir dir("hub-shape");
  write_file(dir.file("a/b"), "x");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  EXPECT_FALSE(hub_looks_like_id("a/b"));  // an existing path is a path
  fs::current_path(cwd);
}

TEST(HubCache, CacheDirFromEnvironment) {
  ScopedEnv hub("HF_HUB_CACHE", std::nullopt), home("HF_HOME", std::string("/x/hf"));
  EXPECT_EQ(hub_cache_dir(), "/x/hf/hub");
  {
    ScopedEnv h2("HF_HUB_CACHE", std::string("/y/hub"));
    EXPECT_EQ(hub_cache_dir(), "/y/hub");
  }
  ScopedEnv no_home("HF_HOME", std::nullopt), user("HOME", std::string("/home/u"));
  EXPECT_EQ(hub_cache_dir(), "/home/u/.cache/huggingface/hub");
}

TEST(HubCache, ResolvesModelAndDataSetIdsWithAndWithoutRevision) {
  FakeHub hub;
  EXPECT_EQ(resolve_model_dir("x/y"), hub.model_snapshot());
  EXPECT_EQ(resolve_model_dir("x/y@abcdef"), hub.model_snapshot());  // a unique hash prefix
  EXPECT_EQ(resolve_model_dir(hub.model_snapshot()), hub.model_snapshot());
  EXPECT_EQ(hf_load("x/y").dir, hub.model_snapshot());
  EXPECT_EQ(resolve_tokenizer("x/y"), hub.model_snapshot() + "/tokenizer.json");
  EXPECT_EQ(hub_resolve("HuggingFaceH4/ultrachat_200k", HubRepoType::Dataset), hub.snapshot(kRev1));
  EXPECT_EQ(hub_resolve("HuggingFaceH4/ultrachat_200k@v2", HubRepoType::Dataset), hub.snapshot(kRev2));
  EXPECT_EQ(hub_resolve(std::string("HuggingFaceH4/ultrachat_200k@") + kRev2, HubRepoType::Dataset), hub.snapshot(kRev2));
  EXPECT_EQ(names(resolve_data_files({"HuggingFaceH4/ultrachat_200k@v2"})),
            (std::vector<std::string>{"train_sft-00000-of-00001-ffff.parquet"}));
  EXPECT_ERROR_CONTAINS([&] { hub_resolve("HuggingFaceH4/ultrachat_200k@nope", HubRepoType::Dataset); },
                        "revision 'nope'", "main, v2", kRev1);
}

TEST(HubCache, MissingIdSaysWhereItLookedAndHowToFetch) {
  FakeHub hub;
  const std::string cache = hub.dir.file("hub");
  EXPECT_ERROR_CONTAINS([&] { hf_load("Qwen/Qwen3.5-27B"); }, "Qwen/Qwen3.5-27B", "models--Qwen--Qwen3.5-27B",
                        cache.c_str(), "huggingface-cli download Qwen/Qwen3.5-27B", "hf download Qwen/Qwen3.5-27B");
  EXPECT_ERROR_CONTAINS([&] { resolve_data_files({"someone/missing_set"}); }, "datasets--someone--missing_set",
                        "huggingface-cli download someone/missing_set --repo-type dataset");
}

// ---- splits ------------------------------------------------------------------------------------

TEST(DataFiles, SplitsByHfNaming) {
  FakeHub hub;
  EXPECT_EQ(names(resolve_data_files({"HuggingFaceH4/ultrachat_200k"}, "train_sft")),
            (std::vector<std::string>{"train_sft-00000-of-00002-aaaa.parquet", "train_sft-00001-of-00002-bbbb.parquet"}));
  EXPECT_EQ(names(resolve_data_files({hub.snapshot(kRev1) + "/data"}, "test_gen")),
            (std::vector<std::string>{"test_gen-00000-of-00001-eeee.parquet"}));
  EXPECT_ERROR_CONTAINS([&] { resolve_data_files({"HuggingFaceH4/ultrachat_200k"}); }, "several splits",
                        "test_gen, test_sft, train_gen, train_sft", "data.split");
  EXPECT_ERROR_CONTAINS([&] { resolve_data_files({hub.snapshot(kRev1) + "/data"}); }, "several splits");
  EXPECT_ERROR_CONTAINS([&] { resolve_data_files({"HuggingFaceH4/ultrachat_200k"}, "validation"); }, "no split 'validation'",
                        "test_gen, test_sft, train_gen, train_sft");

  EXPECT_EQ(data_file_split("data/train_sft-00000-of-00003-0a1b.parquet"), "train_sft");
  EXPECT_EQ(data_file_split("train.jsonl"), "train");
  EXPECT_EQ(data_file_split("validation/part-1.jsonl"), "validation");
  EXPECT_EQ(data_file_split("notes.jsonl"), "");
  EXPECT_TRUE(data_file_in_split("extra/x.jsonl", "extra"));
  EXPECT_TRUE(data_file_in_split("mine.jsonl", "mine"));
  EXPECT_FALSE(data_file_in_split("train_gen-00000-of-00001.parquet", "train"));

  ScratchDir dir("splits-names");
  write_file(dir.file("train.jsonl"), chat_jsonl("t", 2));
  write_file(dir.file("test.jsonl"), chat_jsonl("s", 1));
  write_file(dir.file("validation/a.jsonl"), chat_jsonl("v", 1));
  EXPECT_EQ(names(resolve_data_files({dir.path()}, "train")), (std::vector<std::string>{"train.jsonl"}));
  EXPECT_EQ(names(resolve_data_files({dir.path()}, "validation")), (std::vector<std::string>{"a.jsonl"}));
  EXPECT_ERROR_CONTAINS([&] { resolve_data_files({dir.path()}); }, "test, train, validation");
}

TEST(DataFiles, RecursiveSortedSkipsHidden) {
  ScratchDir dir("files-recursive");
  write_file(dir.file("b.jsonl"), chat_jsonl("b", 1));
  write_file(dir.file("a/z.json"), "[" + nlohmann::json{{"messages", chat_row("z", 0)["messages"]}}.dump() + "]");
  write_file(dir.file("a/deeper/c.jsonl"), chat_jsonl("c", 1));
  write_file(dir.file(".qwentune-cache/tokens.jsonl"), "not data");
  write_file(dir.file("a/.hidden.jsonl"), "not data");
  write_file(dir.file("README.md"), "# readme");
  const auto files = resolve_data_files({dir.path()});
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0], dir.file("a/deeper/c.jsonl"));
  EXPECT_EQ(files[1], dir.file("a/z.json"));
  EXPECT_EQ(files[2], dir.file("b.jsonl"));
  EXPECT_EQ(list_data_files(dir.path()), files);
  EXPECT_EQ(read_dataset({dir.path()}, {}).size(), 3u);
  // A file named twice is read once; an explicit file is read whatever its name.
  EXPECT_EQ(resolve_data_files({dir.file("b.jsonl"), dir.path()}).size(), 3u);
  EXPECT_EQ(resolve_data_files({dir.file("a/.hidden.jsonl")}).size(), 1u);
  ScratchDir empty("files-empty");
  write_file(empty.file("notes.txt"), "x");
  EXPECT_ERROR_CONTAINS([&] { resolve_data_files({empty.path()}); }, "no data files");
}

TEST(DataFiles, Globs) {
  ScratchDir dir("files-glob");
  for (const char* n : {"train_sft-00000-of-00002.jsonl", "train_sft-00001-of-00002.jsonl", "test_sft-00000-of-00001.jsonl",
                        "train_gen-00000-of-00001.jsonl"})
    write_file(dir.file(std::string("data/") + n), chat_jsonl(n, 1));
  write_file(dir.file("data/train_sft-notes.txt"), "x");
  EXPECT_EQ(names(resolve_data_files({dir.file("data/train_sft-*.jsonl")})),
            (std::vector<std::string>{"train_sft-00000-of-00002.jsonl", "train_sft-00001-of-00002.jsonl"}));
  EXPECT_EQ(names(resolve_data_files({dir.file("data/train_sft-0000?-of-*")})).size(), 2u);  // .txt dropped
  EXPECT_EQ(names(resolve_data_files({dir.file("data/t[e]st_*.jsonl")})),
            (std::vector<std::string>{"test_sft-00000-of-00001.jsonl"}));
  EXPECT_EQ(names(resolve_data_files({dir.file("d*/train_gen-*"), dir.file("data/test_sft-*")})),
            (std::vector<std::string>{"train_gen-00000-of-00001.jsonl", "test_sft-00000-of-00001.jsonl"}));
  EXPECT_EQ(names(resolve_data_files({dir.file("data/*.jsonl")}, "train_gen")),
            (std::vector<std::string>{"train_gen-00000-of-00001.jsonl"}));
  EXPECT_ERROR_CONTAINS([&] { resolve_data_files({dir.file("data/*.jsonl")}); }, "several splits", "test_sft, train_gen, train_sft");
  EXPECT_ERROR_CONTAINS([&] { resolve_data_files({dir.file("data/valid-*.jsonl")}); }, "matches no files");
}

TEST(DataFiles, NonRegularFileAndMissingPath) {
  ScratchDir dir("files-fifo");
  ASSERT_EQ(::mkfifo(dir.file("pipe.jsonl").c_str(), 0600), 0);
  EXPECT_ERROR_CONTAINS([&] { resolve_data_files({dir.file("pipe.jsonl")}); }, "pipe.jsonl", "is not a regular file or directory",
                        "FIFO");
  EXPECT_ERROR_CONTAINS([&] { read_samples(dir.file("pipe.jsonl"), {}); }, "is not a regular file or directory");
  EXPECT_ERROR_CONTAINS([&] { resolve_data_files({dir.file("missing.jsonl")}); }, "missing.jsonl", "does not exist");
}

TEST(DataReaders, Utf8BomIsSkipped) {
  ScratchDir dir("files-bom");
  write_file(dir.file("bom.jsonl"), "\xef\xbb\xbf" + chat_jsonl("b", 2));
  write_file(dir.file("bom.json"), "\xef\xbb\xbf[" + nlohmann::json{{"messages", chat_row("j", 0)["messages"]}}.dump() + "]");
  const auto jl = read_samples(dir.file("bom.jsonl"), {});
  ASSERT_EQ(jl.size(), 2u);
  EXPECT_EQ(jl[0].line, 1);
  EXPECT_EQ(jl[0].messages[0].content, "question b 0");
  EXPECT_EQ(read_samples(dir.file("bom.json"), {}).size(), 1u);
}

// ---- streaming ---------------------------------------------------------------------------------

TEST(DataReaders, ChunkedReadEqualsWholeRead) {
  ScratchDir dir("files-chunked");
  std::vector<nlohmann::json> rows;
  for (int i = 0; i < 23; ++i) rows.push_back(chat_row("p", i));
  testing::PqWriteOptions o;
  o.rows_per_group = 5;
  testing::pq_write_file(dir.file("x.parquet"), testing::pq_ultrachat_schema(), rows, o);
  write_file(dir.file("x.jsonl"), chat_jsonl("p", 23));
  for (const char* f : {"x.parquet", "x.jsonl"}) {
    const auto whole = read_samples(dir.file(f), {});
    std::vector<Sample> chunked;
    int chunks = 0;
    double last_fraction = 0;
    read_samples_chunked(dir.file(f), {}, nullptr, 4, [&](std::vector<Sample>& c, double fraction) {
      EXPECT_LE(c.size(), 4u);
      EXPECT_GE(fraction, last_fraction);
      last_fraction = fraction;
      ++chunks;
      for (auto& s : c) chunked.push_back(std::move(s));
    });
    ASSERT_EQ(chunked.size(), whole.size()) << f;
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_EQ(chunked[i].line, whole[i].line);
      EXPECT_EQ(chunked[i].messages[1].content, whole[i].messages[1].content);
    }
    EXPECT_EQ(last_fraction, 1.0);
    EXPECT_EQ(chunks, 6) << f << ": 23 rows in chunks of at most 4";
  }
}

// ---- token cache location ----------------------------------------------------------------------

TEST(DataFiles, TokenCacheFallsBackWhenTheDataDirIsNotWritable) {
  ScratchDir dir("cache-fallback");
  ScopedEnv xdg("XDG_CACHE_HOME", dir.file("xdg"));
  write_file(dir.file("data/a.jsonl"), chat_jsonl("a", 1));
  EXPECT_EQ(default_token_cache_dir({dir.file("data/a.jsonl")}), dir.file("data/.qwentune-cache"));
  EXPECT_EQ(default_token_cache_dir({dir.file("data")}), dir.file("data/.qwentune-cache"));
  EXPECT_EQ(default_token_cache_dir({"HuggingFaceH4/ultrachat_200k"}), dir.file("xdg/qwentune"));
  // /proc refuses new files even to root: the fallback is taken whoever runs the test.
  EXPECT_EQ(default_token_cache_dir({"/proc/self/status"}), dir.file("xdg/qwentune"));
  {
    ScopedEnv no_xdg("XDG_CACHE_HOME", std::nullopt), home("HOME", dir.file("home"));
    EXPECT_EQ(default_token_cache_dir({"/proc/self/status"}), dir.file("home/.cache/qwentune"));
  }
  write_file(dir.file("ro/a.jsonl"), chat_jsonl("a", 1));
  ::chmod(dir.file("ro").c_str(), 0555);
  const bool writable = dir_is_writable(dir.file("ro/.probe"));
  const std::string got = default_token_cache_dir({dir.file("ro/a.jsonl")});
  ::chmod(dir.file("ro").c_str(), 0755);
  if (writable) GTEST_SKIP() << "running as root: a chmod 0555 directory is still writable";
  EXPECT_EQ(got, dir.file("xdg/qwentune"));
}

// ---- configs, data jobs and the eval set --------------------------------------------------------

TEST(DataJob, HubIdsAreKeptUntilUsed) {
  ScratchDir dir("job-ids");
  ScopedEnv hub("HF_HUB_CACHE", dir.file("no-such-cache"));
  write_file(dir.file("c.yaml"),
             "model: Qwen/Qwen3.5-27B\ndata:\n  path: HuggingFaceH4/ultrachat_200k\n  split: train_sft\n"
             "  eval_split: test_sft\ntrain:\n  backend: cpu\n");
  const TrainConfig c = train_config_load(dir.file("c.yaml"), {});  // no cache needed to parse
  EXPECT_EQ(c.model, "Qwen/Qwen3.5-27B");
  EXPECT_EQ(c.data.tokenizer, "Qwen/Qwen3.5-27B");
  EXPECT_EQ(c.data.data, (std::vector<std::string>{"HuggingFaceH4/ultrachat_200k"}));
  EXPECT_EQ(c.data.eval_data, c.data.data);
  EXPECT_EQ(c.data.split, "train_sft");
  EXPECT_EQ(c.data.eval_split, "test_sft");
  write_file(dir.file("local/x.jsonl"), chat_jsonl("x", 1));
  write_file(dir.file("d.yaml"), "model: m\ndata:\n  path: [local/x.jsonl, 'local/*.jsonl']\n  eval_path: e/f.jsonl\n");
  const DataJob j = data_job_from_yaml(yaml_load_file(dir.file("d.yaml")), dir.file("d.yaml"));
  EXPECT_EQ(j.data, (std::vector<std::string>{dir.file("local/x.jsonl"), dir.file("local/*.jsonl")}));
  EXPECT_EQ(j.eval_data, (std::vector<std::string>{dir.file("e/f.jsonl")}));  // a missing file stays config-relative
  write_file(dir.file("g.yaml"), "model: m\ndata:\n  path: owner/set\n");
  EXPECT_EQ(data_job_from_yaml(yaml_load_file(dir.file("g.yaml")), dir.file("g.yaml")).data,
            (std::vector<std::string>{"owner/set"}));  // not there, shaped as an id: kept for the hub cache
  write_file(dir.file("e.yaml"), "model: m\ndata:\n  path: a.jsonl\n  eval_split: x\n  split: x\n");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(dir.file("e.yaml"), {}); }, "is the training set");
  write_file(dir.file("f.yaml"), "model: m\ndata:\n  path: a.jsonl\n  eval_path: b.jsonl\ntrain:\n  eval_fraction: 0.1\n");
  EXPECT_ERROR_CONTAINS([&] { train_config_load(dir.file("f.yaml"), {}); }, "eval_fraction", "eval_path");
}

TEST(DataJob, HubDataSetSplitAndEvalSplitTokenize) {
  FakeHub hub;
  ScopedEnv xdg("XDG_CACHE_HOME", hub.dir.file("xdg"));
  write_file(hub.dir.file("c.yaml"),
             "model: x/y\ndata:\n  path: HuggingFaceH4/ultrachat_200k\n  split: train_sft\n  eval_split: test_sft\n"
             "  thinking: off\n");
  const DataJob job = data_job_from_yaml(yaml_load_file(hub.dir.file("c.yaml")), hub.dir.file("c.yaml"));
  const Tokenizer tok = Tokenizer::load(resolve_tokenizer(job.tokenizer));
  const TokenizeResult train = tokenize_data_job(job, tok);
  EXPECT_EQ(train.data.num_samples(), 9);  // both train_sft shards, nothing else
  EXPECT_EQ(fs::path(train.cache_path).parent_path().string(), hub.dir.file("xdg/qwentune"));
  EXPECT_EQ(tokenize_eval_set(job, tok).num_samples(), 3);
  EXPECT_TRUE(tokenize_data_job(job, tok).cache_hit);
  DataJob overlap = job;
  overlap.eval_split = "";
  overlap.eval_data = {hub.snapshot(kRev1) + "/data/train_sft-00001-of-00002-bbbb.parquet"};
  EXPECT_ERROR_CONTAINS([&] { tokenize_eval_set(overlap, tok); }, "in both the training set and the eval set");
}

// The eval set is evaluated, never trained on: none of its samples is in the training set, and the
// training set keeps every sample of its own files.
TEST(DataJob, EvalPathIsNeverTrainedOn) {
  ScratchDir dir("job-eval");
  write_random_model_dir("tiny", dir.file("model"), 4, DType::F32);
  write_file(dir.file("train.jsonl"), chat_jsonl("train", 12));
  write_file(dir.file("held/eval.jsonl"), chat_jsonl("eval", 4));
  write_file(dir.file("c.yaml"),
             "model: model\noutput_dir: out\ndata:\n  path: train.jsonl\n  eval_path: held\n  thinking: off\n"
             "  tokens_per_batch: 256\n  cache_dir: cache\ntrain:\n  backend: cpu\n  max_steps: 2\n  log_every: 0\n");
  const TrainConfig cfg = train_config_load(dir.file("c.yaml"), {});
  const Tokenizer tok = Tokenizer::load(resolve_tokenizer(cfg.data.tokenizer));
  const TokenizedDataset train = tokenize_data_job(cfg.data, tok).data;
  const TokenizedDataset eval = tokenize_eval_set(cfg.data, tok);
  ASSERT_EQ(train.num_samples(), 12);
  ASSERT_EQ(eval.num_samples(), 4);
  auto sample = [](const TokenizedDataset& d, int64_t i) {
    return std::vector<int32_t>(d.input_ids.begin() + d.offsets[static_cast<size_t>(i)],
                                d.input_ids.begin() + d.offsets[static_cast<size_t>(i) + 1]);
  };
  std::set<std::vector<int32_t>> trained;
  for (int64_t i = 0; i < train.num_samples(); ++i) trained.insert(sample(train, i));
  for (int64_t i = 0; i < eval.num_samples(); ++i) EXPECT_FALSE(trained.count(sample(eval, i))) << "eval sample " << i;
  const TrainSummary s = train_run(cfg);
  EXPECT_EQ(s.steps, 2);
  EXPECT_GT(s.eval_loss, 0.0);  // the held-out set was evaluated
}

}  // namespace
}  // namespace qt
