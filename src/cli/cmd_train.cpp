// qwentune train --config FILE.yaml [--set section.key=value ...]
// qwentune generate --model DIR [--adapter DIR] (--prompt TEXT | --eval FILE.jsonl) [...]
// qwentune merge --model BASE --adapter DIR --out DIR
#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "data/data_job.h"
#include "io/peft_adapter.h"
#include "model/generate.h"
#include "model/lora.h"
#include "ops/cpu/cpu_backend.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "profile/profiler.h"
#include "train/trainer.h"

namespace qt::cli {
namespace {

// The prompt a chat model continues: the user turn plus the assistant generation prompt of the
// official template (enable_thinking=false gives the empty think block).
std::string chat_prompt(const std::string& user, ThinkingMode thinking) {
  std::string p = "<|im_start|>user\n" + std::string(py_strip(user)) + "<|im_end|>\n<|im_start|>assistant\n";
  p += thinking == ThinkingMode::Off ? "<think>\n\n</think>\n\n" : "<think>\n";
  return p;
}

struct GenerateJob {
  std::string model, adapter, prompt, eval;
  bool chat = true;
  std::string thinking = "off";
  GenerateOptions opts;
};

void run_generate(const GenerateJob& job) {
  HfModelDir dir = hf_load(job.model);
  const Tokenizer tok = Tokenizer::load(resolve_tokenizer(job.model));
  GenerateOptions opts = job.opts;
  for (const char* stop : {"<|im_end|>", "<|endoftext|>"})
    if (auto id = tok.token_to_id(stop)) opts.stop_ids.push_back(*id);
  // Only ids the tokenizer can decode (Qwen checkpoints have ~270 embedding rows past the tokenizer).
  opts.allowed_ids.assign(static_cast<size_t>(dir.config.vocab_size), false);
  int64_t decodable = 0;
  for (int64_t i = 0; i < dir.config.vocab_size; ++i) decodable += opts.allowed_ids[size_t(i)] = tok.has_id(static_cast<int32_t>(i));
  QT_CHECK(decodable > 0, job.model, ": the tokenizer decodes none of the model's ", dir.config.vocab_size, " ids");
  const ThinkingMode thinking = thinking_mode_from_name(job.thinking);
  auto encode_prompt = [&](const std::string& text) {
    return tok.encode(job.chat ? chat_prompt(text, thinking) : text);
  };
  auto strip_stop = [&](std::vector<int32_t> ids) {
    if (!ids.empty() && std::find(opts.stop_ids.begin(), opts.stop_ids.end(), ids.back()) != opts.stop_ids.end())
      ids.pop_back();
    return ids;
  };
  CpuBackend be;
  // --adapter: a LoRA model; the decoder runs it with the merged weights.
  std::unique_ptr<PeftAdapter> adapter;
  LoraSpec lora;
  if (!job.adapter.empty()) {
    adapter = std::make_unique<PeftAdapter>(peft_adapter_open(job.adapter));
    lora = lora_spec_from_peft(*adapter);
  }
  auto load_model = [&](Qwen35Model& model) {
    model.load(dir);
    if (!adapter) return;
    const auto w = lora_read_adapter(*adapter, model.specs());
    for (size_t i = 0; i < w.size(); ++i) model.set_param_f32(i, w[i]);
  };
  const LoraSpec* lora_ptr = adapter ? &lora : nullptr;
  if (job.eval.empty()) {
    const std::vector<int32_t> prompt = encode_prompt(job.prompt);
    if (static_cast<int64_t>(prompt.size()) + opts.max_new_tokens > dir.config.max_position_embeddings)
      log_warn("generate: the prompt (", prompt.size(), " tokens) plus --max-new-tokens ", opts.max_new_tokens,
               " passes the model's max_position_embeddings (", dir.config.max_position_embeddings,
               "); generation stops there");
    Qwen35Model model(dir.config, be, 1, Checkpointing::None, lora_ptr);  // holds the weights; decoding is incremental
    load_model(model);
    const GenerateResult r = generate(model, prompt, opts);
    std::printf("%s\n", tok.decode(strip_stop(r.ids)).c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "generate: %zu tokens, stopped by %s\n", r.ids.size(), r.stop_reason.c_str());
    return;
  }
  // --eval: exact-match accuracy of the (trimmed) completion against "answer".
  std::ifstream in(job.eval);
  QT_CHECK(in.good(), job.eval, ": cannot open");
  std::vector<std::pair<std::string, std::string>> items;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      QT_FAIL(job.eval, ":", lineno, ": malformed JSON: ", e.what());
    }
    QT_CHECK(j.is_object() && j.contains("prompt") && j["prompt"].is_string() && j.contains("answer") &&
                 j["answer"].is_string(),
             job.eval, ":", lineno, ": expected {\"prompt\": \"...\", \"answer\": \"...\"}");
    items.emplace_back(j["prompt"].get<std::string>(), j["answer"].get<std::string>());
  }
  QT_CHECK(!items.empty(), job.eval, ": no items");
  Qwen35Model model(dir.config, be, 1, Checkpointing::None, lora_ptr);  // decoding is incremental (model/decoder.h)
  load_model(model);
  int64_t correct = 0;
  nlohmann::ordered_json examples = nlohmann::ordered_json::array();
  for (const auto& [prompt, answer] : items) {
    const std::string got(py_strip(tok.decode(strip_stop(generate(model, encode_prompt(prompt), opts).ids))));
    const bool ok = got == py_strip(answer);
    correct += ok;
    if (examples.size() < 3) examples.push_back({{"prompt", prompt}, {"answer", answer}, {"output", got}, {"correct", ok}});
  }
  nlohmann::ordered_json r = {{"accuracy", double(correct) / double(items.size())}, {"correct", correct},
                              {"total", items.size()}, {"examples", examples}};
  std::printf("%s\n", r.dump().c_str());
}

}  // namespace

void add_train_commands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("merge", "Merge a PEFT LoRA adapter into its base: an HF directory in the base's dtype");
    auto base = std::make_shared<std::string>(), adapter = std::make_shared<std::string>(), out = std::make_shared<std::string>();
    auto force = std::make_shared<bool>(false);
    cmd->add_option("--model", *base, "the base HF model directory or hub id")->required();
    cmd->add_option("--adapter", *adapter, "the PEFT LoRA adapter directory")->required();
    cmd->add_option("--out", *out, "output directory")->required();
    cmd->add_flag("--force", *force, "write into a non-empty directory that is not a model directory (its files are kept)");
    cmd->callback([=] {
      const int64_t n = lora_merge_dirs(*base, *adapter, *out, *force);
      std::printf("merged %lld adapted weights into %s\n", static_cast<long long>(n), out->c_str());
    });
  }
  {
    auto* cmd = app.add_subcommand("train", "Fine-tune a model (YAML config; --set overrides any key)");
    auto config = std::make_shared<std::string>();
    auto sets = std::make_shared<std::vector<std::string>>();
    cmd->add_option("--config", *config, "YAML config")->required();
    cmd->add_option("--set", *sets, "override: section.key=value (repeatable)");
    auto profile_steps = std::make_shared<std::string>();
    cmd->add_option("--profile-steps", *profile_steps,
                    "A:B: profile steps A..B (op/layer tables, output_dir/profile_trace.json)");
    auto no_graph = std::make_shared<bool>(false);
    cmd->add_flag("--no-graph", *no_graph, "run the CUDA step eagerly, kernel by kernel (debugging); = --set train.cuda_graph=false");
    auto print_config = std::make_shared<bool>(false);
    cmd->add_flag("--print-config", *print_config, "print the resolved config (every key, its default and meaning) as YAML and exit");
    auto overwrite = std::make_shared<bool>(false);
    cmd->add_flag("--overwrite", *overwrite, "start fresh in an output_dir that holds an earlier run, replacing its outputs");
    cmd->callback([=] {
      TrainConfig c = train_config_load(*config, *sets);
      if (*print_config) {
        std::fputs(c.resolved_yaml.c_str(), stdout);
        return;
      }
      if (!profile_steps->empty()) profile::parse_step_range(*profile_steps, c.profile_first, c.profile_last);
      if (*no_graph) c.cuda_graph = false;
      c.overwrite = *overwrite;
      const TrainSummary s = train_run(c);
      if (s.stop_signal) exit_status() = 128 + s.stop_signal;
    });
  }
  {
    auto* cmd = app.add_subcommand("generate", "Generate text with a model (greedy by default)");
    auto job = std::make_shared<GenerateJob>();
    auto raw = std::make_shared<bool>(false);
    auto* prompt = cmd->add_option("--prompt", job->prompt, "user message (or raw text with --raw)");
    auto* eval = cmd->add_option("--eval", job->eval, "JSONL of {prompt, answer}: prints exact-match accuracy");
    prompt->excludes(eval);
    cmd->add_option("--model", job->model, "HF model directory or hub id (Qwen/Qwen3.5-2B[@rev])")->required();
    cmd->add_option("--adapter", job->adapter, "a PEFT LoRA adapter directory to apply to the model");
    cmd->add_flag("--raw", *raw, "use the prompt as raw text, without the chat template");
    cmd->add_option("--thinking", job->thinking, "on|off: the assistant generation prompt")->capture_default_str();
    cmd->add_option("--max-new-tokens", job->opts.max_new_tokens, "")->capture_default_str()->check(CLI::PositiveNumber);
    cmd->add_option("--temperature", job->opts.temperature, "0 = greedy")->capture_default_str();
    cmd->add_option("--top-k", job->opts.top_k, "0 = all tokens")->capture_default_str();
    cmd->add_option("--seed", job->opts.seed, "sampling seed")->capture_default_str();
    cmd->callback([=] {
      QT_CHECK(!job->prompt.empty() || !job->eval.empty(), "generate needs --prompt or --eval");
      QT_CHECK(std::isfinite(job->opts.temperature) && job->opts.temperature >= 0, "--temperature ", job->opts.temperature,
               ": must be a finite number >= 0 (0 = greedy)");
      QT_CHECK(job->opts.top_k >= 0, "--top-k ", job->opts.top_k, ": must be >= 0 (0 = every token)");
      GenerateJob j = *job;
      j.chat = !*raw;
      run_generate(j);
    });
  }
}

}  // namespace qt::cli
