#include "data/token_cache.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "data/data_files.h"
#include "text/tokenizer.h"

namespace qt {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'Q', 'T', 'T', 'O', 'K', 'C', 'v', '1'};

uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Streaming 128-bit content hash (two murmur-style lanes over 8-byte words). Not cryptographic:
// it only has to change when the inputs change.
class Hasher {
 public:
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    while (n > 0) {
      const size_t take = std::min(n, sizeof pending_ - fill_);
      std::memcpy(pending_ + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ == sizeof pending_) {
        uint64_t w;
        std::memcpy(&w, pending_, 8);
        mix(w);
        fill_ = 0;
      }
    }
  }
  void update_str(const std::string& s) {
    const uint64_t n = s.size();
    update(&n, sizeof n);
    update(s.data(), s.size());
  }
  std::string hex() const {
    Hasher h = *this;
    uint64_t w = 0;
    std::memcpy(&w, h.pending_, h.fill_);
    h.mix(w ^ (static_cast<uint64_t>(h.fill_) << 56));
    const uint64_t x = fmix64(h.a_ ^ h.total_), y = fmix64(h.b_ + x);
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(x + y),
                  static_cast<unsigned long long>(y));
    return buf;
  }

 private:
  void mix(uint64_t w) {
    a_ = rotl(a_ ^ fmix64(w), 27) * 0x9e3779b97f4a7c15ull + b_;
    b_ = rotl(b_ ^ fmix64(w ^ 0x5bd1e9955bd1e995ull), 31) * 0xc2b2ae3d27d4eb4full + a_;
  }
  uint64_t a_ = 0x243f6a8885a308d3ull, b_ = 0x13198a2e03707344ull, total_ = 0;
  unsigned char pending_[8] = {};
  size_t fill_ = 0;
};

void hash_file(Hasher& h, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  QT_CHECK(f.good(), path, ": cannot open for hashing");
  std::vector<char> buf(1 << 20);
  const uint64_t size = fs::file_size(path);
  h.update(&size, sizeof size);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(f.gcount()));
  }
}

template <typename T>
void write_pod(std::ofstream& f, Hasher& h, const T* p, size_t n) {
  f.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * sizeof(T)));
  h.update(p, n * sizeof(T));
}

template <typename T>
bool read_pod(std::ifstream& f, Hasher& h, T* p, size_t n) {
  f.read(reinterpret_cast<char*>(p), static_cast<std::streamsize>(n * sizeof(T)));
  if (static_cast<size_t>(f.gcount()) != n * sizeof(T)) return false;
  h.update(p, n * sizeof(T));
  return true;
}

void write_cache(const std::string& path, const TokenizedDataset& d, const ReadStats& rs) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    QT_CHECK(f.good(), tmp, ": cannot write the token cache");
    Hasher h;
    write_pod(f, h, kMagic, 8);
    const uint64_t hdr[5] = {static_cast<uint64_t>(d.num_samples()), static_cast<uint64_t>(d.num_tokens()),
                             static_cast<uint64_t>(rs.rows), static_cast<uint64_t>(rs.bad_rows),
                             static_cast<uint64_t>(rs.utf8_fixed)};
    write_pod(f, h, hdr, 5);
    write_pod(f, h, d.offsets.data(), d.offsets.size());
    write_pod(f, h, d.input_ids.data(), d.input_ids.size());
    write_pod(f, h, d.labels.data(), d.labels.size());
    const std::string sum = h.hex();
    f.write(sum.data(), static_cast<std::streamsize>(sum.size()));
    QT_CHECK(f.good(), tmp, ": write failed (disk full?)");
  }
  fs::rename(tmp, path);
}

// False (with a warning) when the file is damaged; the caller then rebuilds it.
bool read_cache(const std::string& path, TokenizedDataset* d, ReadStats* rs) {
  std::ifstream f(path, std::ios::binary);
  if (!f.good()) return false;
  Hasher h;
  char magic[8];
  uint64_t hdr[5];
  if (!read_pod(f, h, magic, 8) || std::memcmp(magic, kMagic, 8) != 0 || !read_pod(f, h, hdr, 5)) {
    log_warn(path, ": not a token cache of this version; rebuilding it");
    return false;
  }
  const uint64_t expect = 8 + 5 * 8 + (hdr[0] + 1) * 8 + hdr[1] * 8 + 32;
  if (fs::file_size(path) != expect) {
    log_warn(path, ": token cache has the wrong size; rebuilding it");
    return false;
  }
  d->offsets.resize(hdr[0] + 1);
  d->input_ids.resize(hdr[1]);
  d->labels.resize(hdr[1]);
  char sum[32];
  if (!read_pod(f, h, d->offsets.data(), d->offsets.size()) || !read_pod(f, h, d->input_ids.data(), d->input_ids.size()) ||
      !read_pod(f, h, d->labels.data(), d->labels.size()) || !f.read(sum, 32) ||
      std::string(sum, 32) != h.hex() || d->offsets.front() != 0 ||
      d->offsets.back() != static_cast<int64_t>(hdr[1])) {
    log_warn(path, ": token cache is damaged; rebuilding it");
    *d = TokenizedDataset{};
    return false;
  }
  rs->rows = static_cast<int64_t>(hdr[2]);
  rs->bad_rows = static_cast<int64_t>(hdr[3]);
  rs->utf8_fixed = static_cast<int64_t>(hdr[4]);
  rs->samples = static_cast<int64_t>(hdr[0]);
  return true;
}

// Rows a chunk of reading + tokenizing holds (its text, then its token ids).
constexpr int64_t kChunkRows = 8192;

// A progress line on stderr while a large set is tokenized: redrawn in place (at most 4 times a
// second) when stderr is a terminal, else one log line every 10 s, so short runs and test logs
// stay quiet.
class ProgressLine {
 public:
  ProgressLine() : tty_(::isatty(2) == 1), start_(clock::now()), last_(start_) {}
  void update(int64_t rows, int64_t tokens, double fraction) {
    const auto now = clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (log_level() > LogLevel::Info || since < (tty_ ? 0.25 : 10.0)) return;
    last_ = now;
    print(rows, tokens, fraction, false);
  }
  void finish(int64_t rows, int64_t tokens) {
    if (printed_) print(rows, tokens, 1.0, true);
  }

 private:
  using clock = std::chrono::steady_clock;
  void print(int64_t rows, int64_t tokens, double fraction, bool done) {
    const double secs = std::max(1e-9, std::chrono::duration<double>(clock::now() - start_).count());
    const double rate = static_cast<double>(rows) / secs;
    const std::string line = str("tokenizing: ", rows, " rows, ", tokens, " tokens, ", static_cast<int>(fraction * 100.0),
                                 "% in ", static_cast<int64_t>(secs), " s (", static_cast<int64_t>(rate), " rows/s)");
    if (tty_) {
      std::fprintf(stderr, "\r%s\x1b[K%s", line.c_str(), done ? "\n" : "");
      std::fflush(stderr);
    } else {
      log_info(line);
    }
    printed_ = true;
  }
  bool tty_;
  clock::time_point start_, last_;
  bool printed_ = false;
};

// Appends part to d. Capacity grows to the size the whole set is expected to reach (from the
// share read so far), so the token arrays are copied a few times at most, not log2(n) times.
void append_tokens(TokenizedDataset& d, const TokenizedDataset& part, double fraction) {
  auto grow = [&](auto& v, size_t add) {
    const size_t need = v.size() + add;
    if (need <= v.capacity()) return;
    size_t want = need + need / 2;
    if (fraction > 0.05) want = std::max(want, static_cast<size_t>(static_cast<double>(need) / fraction * 1.02));
    v.reserve(want);
  };
  grow(d.input_ids, part.input_ids.size());
  grow(d.labels, part.labels.size());
  grow(d.offsets, static_cast<size_t>(part.num_samples()));
  const int64_t base = d.num_tokens();
  d.input_ids.insert(d.input_ids.end(), part.input_ids.begin(), part.input_ids.end());
  d.labels.insert(d.labels.end(), part.labels.begin(), part.labels.end());
  for (size_t i = 1; i < part.offsets.size(); ++i) d.offsets.push_back(base + part.offsets[i]);
}

}  // namespace

std::string token_cache_key(const std::vector<std::string>& data_files, const std::string& tokenizer_json_path,
                            const DataOptions& opts) {
  Hasher h;
  h.update_str("qwentune token cache v1");
  h.update_str(str("thinking=", thinking_mode_name(opts.chat.thinking), " train_on=", train_on_name(opts.chat.train_on),
                   " schema=", data_schema_name(opts.read.schema), " skip_bad_rows=", opts.read.skip_bad_rows,
                   " fix_utf8=", opts.read.fix_utf8));
  hash_file(h, tokenizer_json_path);
  for (const auto& f : data_files) hash_file(h, f);
  return h.hex();
}

TokenizedDataset tokenize_samples(const std::vector<Sample>& samples, const ChatTemplateOptions& chat,
                                  const EncodeFn& encode, int threads) {
  const int64_t n = static_cast<int64_t>(samples.size());
  std::vector<TokenizedChat> out(samples.size());
  const int saved = num_threads();
  if (threads > 0) set_num_threads(threads);
  try {
    parallel_for(
        n,
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            const Sample& s = samples[static_cast<size_t>(i)];
            TokenizedChat& t = out[static_cast<size_t>(i)];
            if (s.pretokenized) {
              t.input_ids = s.input_ids;
              t.labels = s.labels.empty() ? s.input_ids : s.labels;
              continue;
            }
            try {
              t = chat_tokenize(s.messages, chat, encode);
            } catch (const Error& err) {
              QT_FAIL(s.location(), ": ", err.what());
            }
          }
        },
        16);
  } catch (...) {
    set_num_threads(saved);
    throw;
  }
  set_num_threads(saved);
  TokenizedDataset d;
  size_t total = 0;
  for (const auto& t : out) total += t.input_ids.size();
  d.input_ids.reserve(total);
  d.labels.reserve(total);
  d.offsets.reserve(out.size() + 1);
  for (const auto& t : out) d.add(t.input_ids, t.labels);
  return d;
}

TokenizeResult tokenize_files(const std::vector<std::string>& files, const Tokenizer& tokenizer, const DataOptions& opts,
                              const std::string& cache_dir, int threads) {
  QT_CHECK(!files.empty(), "no data files given");
  TokenizeResult r;
  if (!cache_dir.empty()) {
    r.key = token_cache_key(files, tokenizer.path(), opts);
    fs::create_directories(cache_dir);
    r.cache_path = (fs::path(cache_dir) / ("tokens-" + r.key + ".bin")).string();
    if (fs::exists(r.cache_path) && read_cache(r.cache_path, &r.data, &r.read_stats)) {
      r.cache_hit = true;
      log_info("token cache hit: ", r.cache_path, " (", r.data.num_samples(), " samples, ", r.data.num_tokens(), " tokens)");
      return r;
    }
  }
  ReadOptions ro = opts.read;
  ro.vocab_size = tokenizer.vocab_size();
  const bool fix = opts.read.fix_utf8;
  const EncodeFn encode = [&](std::string_view s) { return tokenizer.encode(s, fix); };
  double total_bytes = 0, done_bytes = 0;
  for (const auto& f : files) total_bytes += static_cast<double>(fs::file_size(f));
  ProgressLine progress;
  for (const auto& f : files) {
    const double size = static_cast<double>(fs::file_size(f));
    read_samples_chunked(f, ro, &r.read_stats, kChunkRows, [&](std::vector<Sample>& chunk, double file_fraction) {
      const TokenizedDataset part = tokenize_samples(chunk, opts.chat, encode, threads);
      chunk.clear();
      const double fraction = total_bytes > 0 ? (done_bytes + file_fraction * size) / total_bytes : 1.0;
      append_tokens(r.data, part, fraction);
      progress.update(r.read_stats.rows, r.data.num_tokens(), fraction);
    });
    done_bytes += size;
  }
  progress.finish(r.read_stats.rows, r.data.num_tokens());
  if (!r.cache_path.empty()) {
    write_cache(r.cache_path, r.data, r.read_stats);
    log_info("token cache written: ", r.cache_path);
  }
  return r;
}

TokenizeResult tokenize_dataset(const std::vector<std::string>& paths, const Tokenizer& tokenizer,
                                const DataOptions& opts, const std::string& cache_dir, int threads) {
  return tokenize_files(resolve_data_files(paths), tokenizer, opts, cache_dir, threads);
}

}  // namespace qt
