// Byte-level BPE tokenizer matching Hugging Face `tokenizers` (encode with add_special_tokens=False).
//
// encode(text) runs the same stages as HF's Tokenizer::encode:
//   1. added tokens with normalized=false are found in the raw text (leftmost, then longest);
//   2. every piece between them is normalized (NFC, ...) and searched for normalized=true added tokens;
//   3. the remaining pieces go through the pre-tokenizer (Split regex, ByteLevel) and
//   4. BPE by merge rank, on bytes: a byte-level vocabulary entry is decoded to the bytes it
//      stands for, so the GPT-2 byte<->unicode mapping never has to be applied to the text.
// Per-thread state (regex match data, JIT stack, word cache, scratch buffers) lives in ThreadCtx;
// a thread keeps its context in thread-local storage and hands it back to the tokenizer's pool when
// it exits, so short-lived worker threads (qt::parallel_for) still find a warm word cache.
#include "text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/bpe_builder.h"

namespace qt {
namespace {

using json = nlohmann::json;

// ---- UTF-8 -------------------------------------------------------------------------------------

// Length of the well-formed UTF-8 sequence at s[0..n) (Unicode table 3-7), or 0 if ill-formed.
// For an ill-formed sequence *bad_len is the length of its maximal valid prefix (at least 1): the
// unit that WHATWG / Rust's from_utf8_lossy replace with one U+FFFD.
inline size_t utf8_seq_len(const unsigned char* s, size_t n, size_t* bad_len) {
  const unsigned char c = s[0];
  *bad_len = 1;
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) {
    need = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    need = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    need = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= n) return 0;
    const unsigned char b = s[k];
    if (b < lo || b > hi) return 0;
    lo = 0x80;
    hi = 0xbf;
    *bad_len = k + 1;
  }
  return need;
}

// Byte offset of the first ill-formed sequence, or npos.
size_t utf8_first_invalid(std::string_view t) {
  const auto* s = reinterpret_cast<const unsigned char*>(t.data());
  const size_t n = t.size();
  size_t i = 0;
  while (i < n) {
    // Eight ASCII bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    size_t bad;
    const size_t len = utf8_seq_len(s + i, n - i, &bad);
    if (!len) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view t) {
  static const char kReplacement[] = "\xef\xbf\xbd";
  const auto* s = reinterpret_cast<const unsigned char*>(t.data());
  std::string out;
  out.reserve(t.size() + 8);
  size_t i = 0;
  while (i < t.size()) {
    size_t bad;
    const size_t len = utf8_seq_len(s + i, t.size() - i, &bad);
    if (len) {
      out.append(t.data() + i, len);
      i += len;
    } else {
      out.append(kReplacement, 3);
      i += bad;
    }
  }
  return out;
}

// Decodes the code point at s[i] of valid UTF-8 and advances i.
inline uint32_t utf8_next(const unsigned char* s, size_t& i) {
  const unsigned char c = s[i];
  if (c < 0x80) {
    i += 1;
    return c;
  }
  if (c < 0xe0) {
    const uint32_t cp = ((c & 0x1fu) << 6) | (s[i + 1] & 0x3fu);
    i += 2;
    return cp;
  }
  if (c < 0xf0) {
    const uint32_t cp = ((c & 0x0fu) << 12) | ((s[i + 1] & 0x3fu) << 6) | (s[i + 2] & 0x3fu);
    i += 3;
    return cp;
  }
  const uint32_t cp =
      ((c & 0x07u) << 18) | ((s[i + 1] & 0x3fu) << 12) | ((s[i + 2] & 0x3fu) << 6) | (s[i + 3] & 0x3fu);
  i += 4;
  return cp;
}

// Last code point of non-empty valid UTF-8.
uint32_t utf8_last(std::string_view t) {
  size_t i = t.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(t[i]) & 0xc0) == 0x80) --i;
  return utf8_next(reinterpret_cast<const unsigned char*>(t.data()), i);
}

uint32_t utf8_first(std::string_view t) {
  size_t i = 0;
  return utf8_next(reinterpret_cast<const unsigned char*>(t.data()), i);
}

// Rust's char::is_whitespace (Unicode White_Space).
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// Rust's char::is_alphanumeric() || c == '_' (HF's word test for single_word added tokens).
bool is_word_char(uint32_t c) {
  if (c == '_') return true;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  switch (cat) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// ---- hashing -----------------------------------------------------------------------------------

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return x;
}

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (s.size() * 0xff51afd7ed558ccdull);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  h = (h ^ w) * 0x9e3779b97f4a7c15ull;
  return mix64(h);
}

// (left id, right id) -> (rank, merged id), open addressing.
class MergeTable {
 public:
  struct Value {
    int32_t rank;
    int32_t id;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, Value{0, 0});
    mask_ = cap - 1;
  }
  void put(int32_t a, int32_t b, Value v) {  // a later duplicate overwrites, as HF's HashMap collect
    const uint64_t k = key(a, b);
    for (size_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == kEmpty || keys_[i] == k) {
        keys_[i] = k;
        values_[i] = v;
        return;
      }
    }
  }
  const Value* get(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == k) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t mask_ = 0;
};

// Per-thread cache: word bytes -> ids. Cleared wholesale when full.
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 256;
  WordCache() { table_.assign(kCapacity, Entry{}); }
  bool find(std::string_view w, uint64_t h, std::vector<int32_t>& out) const {
    for (size_t i = h & (kCapacity - 1);; i = (i + 1) & (kCapacity - 1)) {
      const Entry& e = table_[i];
      if (e.hash == 0) return false;
      if (e.hash == h && e.key_len == w.size() && std::memcmp(keys_.data() + e.key_off, w.data(), w.size()) == 0) {
        out.insert(out.end(), vals_.begin() + e.val_off, vals_.begin() + e.val_off + e.val_len);
        return true;
      }
    }
  }
  void insert(std::string_view w, uint64_t h, const int32_t* ids, size_t n) {
    if (count_ + 1 > kCapacity / 2) clear();
    for (size_t i = h & (kCapacity - 1);; i = (i + 1) & (kCapacity - 1)) {
      Entry& e = table_[i];
      if (e.hash != 0) continue;
      e.hash = h;
      e.key_off = static_cast<uint32_t>(keys_.size());
      e.key_len = static_cast<uint32_t>(w.size());
      e.val_off = static_cast<uint32_t>(vals_.size());
      e.val_len = static_cast<uint32_t>(n);
      keys_.append(w.data(), w.size());
      vals_.insert(vals_.end(), ids, ids + n);
      ++count_;
      return;
    }
  }
  static uint64_t hash(std::string_view w) { return hash_bytes(w) | 1; }  // 0 marks an empty slot

 private:
  static constexpr size_t kCapacity = size_t{1} << 17;
  struct Entry {
    uint64_t hash = 0;
    uint32_t key_off = 0, key_len = 0, val_off = 0, val_len = 0;
  };
  void clear() {
    std::fill(table_.begin(), table_.end(), Entry{});
    keys_.clear();
    vals_.clear();
    count_ = 0;
  }
  std::vector<Entry> table_;
  std::string keys_;
  std::vector<int32_t> vals_;
  size_t count_ = 0;
};

// ---- regex -------------------------------------------------------------------------------------

// HF runs the pattern with Oniguruma, where \s is Unicode White_Space; PCRE2's UCP \s also matches
// U+180E. Spell \s (and \S outside classes) out so both engines agree.
std::string onig_compatible_pattern(const std::string& p) {
  static const char* kSpace = "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      ++i;
      if (d == 's') {
        out += in_class ? std::string(kSpace) : std::string("[") + kSpace + "]";
      } else if (d == 'S' && !in_class) {
        out += std::string("[^") + kSpace + "]";
      } else {
        out += c;
        out += d;
      }
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is literal
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

std::string escape_literal(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::strchr("\\^$.|?*+()[]{}", c) && c != '\0') out += '\\';
    out += c;
  }
  return out;
}

struct Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  Regex() = default;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};

// GPT-2's pattern, used by ByteLevel(use_regex=true).
const char* const kGpt2Regex = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// ---- NFC quick check ---------------------------------------------------------------------------

// Code points below kSafeLimit that NFC leaves alone and that cannot compose with a neighbour
// unless that neighbour is itself unsafe: combining class 0, not a mark, not a conjoining Hangul
// jamo, and NFC-stable on its own. A piece made only of safe code points is already NFC.
constexpr uint32_t kSafeLimit = 0x30000;
const std::vector<uint64_t>& nfc_safe_bits() {
  static const std::vector<uint64_t> bits = [] {
    std::vector<uint64_t> b(kSafeLimit / 64, 0);
    for (uint32_t cp = 0; cp < kSafeLimit; ++cp) {
      if (cp >= 0xd800 && cp <= 0xdfff) continue;
      const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
      if (p->combining_class != 0) continue;
      if (p->category == UTF8PROC_CATEGORY_MN || p->category == UTF8PROC_CATEGORY_MC ||
          p->category == UTF8PROC_CATEGORY_ME)
        continue;
      if (cp >= 0x1100 && cp <= 0x11ff) continue;
      if (p->decomp_seqindex != UINT16_MAX) {  // has a decomposition: safe only if NFC maps it to itself
        utf8proc_int32_t buf[8];
        const auto n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buf, 8,
                                               static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE), nullptr);
        if (n <= 0 || n > 8) continue;
        const auto m = utf8proc_normalize_utf32(buf, n, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
        if (m != 1 || buf[0] != static_cast<utf8proc_int32_t>(cp)) continue;
      }
      b[cp >> 6] |= uint64_t{1} << (cp & 63);
    }
    return b;
  }();
  return bits;
}

// ---- configuration -----------------------------------------------------------------------------

struct AddedSpec {
  int32_t id;
  std::string content;
  bool single_word, lstrip, rstrip, normalized, special;
};

// Trie over the bytes of a set of added tokens; finds leftmost-longest matches.
class AddedMatcher {
 public:
  void add(std::string_view content, int32_t token_index) {
    if (content.empty()) return;
    if (nodes_.empty()) nodes_.emplace_back();
    size_t n = 0;
    for (unsigned char c : content) {
      int32_t child = -1;
      for (const auto& [byte, idx] : nodes_[n].edges)
        if (byte == c) child = idx;
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[n].edges.emplace_back(c, child);
        nodes_.emplace_back();
      }
      n = static_cast<size_t>(child);
    }
    if (nodes_[n].token < 0) nodes_[n].token = token_index;  // first one wins on duplicates
    first_[static_cast<unsigned char>(content[0])] = true;
  }
  bool empty() const { return nodes_.empty(); }
  // Next match at or after `from`: sets start/len/token and returns true.
  bool next(std::string_view s, size_t from, size_t* start, size_t* len, int32_t* token) const {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    for (size_t i = from; i < s.size(); ++i) {
      if (!first_[p[i]]) continue;
      size_t n = 0, best_len = 0;
      int32_t best = -1;
      for (size_t j = i; j < s.size(); ++j) {
        int32_t child = -1;
        for (const auto& [byte, idx] : nodes_[n].edges)
          if (byte == p[j]) {
            child = idx;
            break;
          }
        if (child < 0) break;
        n = static_cast<size_t>(child);
        if (nodes_[n].token >= 0) {
          best = nodes_[n].token;
          best_len = j + 1 - i;
        }
      }
      if (best >= 0) {
        *start = i;
        *len = best_len;
        *token = best;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> edges;
    int32_t token = -1;
  };
  std::vector<Node> nodes_;
  bool first_[256] = {};
};

struct PreStep {
  enum Kind { Split, ByteLevel } kind;
  int regex = -1;  // index into Impl::regexes; -1: ByteLevel without regex
  bool add_prefix_space = false;
};

struct Split {
  int32_t token;  // -1: text
  size_t begin, end;
};

struct HeapEntry {
  int32_t rank;
  int32_t pos;
  int32_t id;
};
struct HeapGreater {  // min-heap on (rank, pos)
  bool operator()(const HeapEntry& a, const HeapEntry& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};
struct Symbol {
  int32_t id;
  int32_t prev, next;
};

// ---- per-thread context ------------------------------------------------------------------------

struct ThreadCtx {
  std::vector<pcre2_match_data*> match_data;
  pcre2_match_context* mcontext = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  WordCache cache;
  std::vector<utf8proc_int32_t> cps;
  std::string normalized;
  std::vector<Split> raw_splits, norm_splits;
  std::vector<Symbol> symbols;
  std::vector<HeapEntry> heap;
  std::vector<int32_t> word_ids;
  ~ThreadCtx() {
    for (auto* md : match_data) pcre2_match_data_free(md);
    if (mcontext) pcre2_match_context_free(mcontext);
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
  }
};

struct CtxPool {
  std::mutex mu;
  std::vector<std::unique_ptr<ThreadCtx>> free;
};

// Contexts held by this thread, most recently used last; given back to their pools at thread exit.
struct ThreadSlots {
  struct Slot {
    uint64_t owner;
    std::weak_ptr<CtxPool> pool;
    std::unique_ptr<ThreadCtx> ctx;
  };
  std::vector<Slot> slots;
  static void give_back(Slot& s) {
    if (auto pool = s.pool.lock()) {
      std::lock_guard<std::mutex> lock(pool->mu);
      pool->free.push_back(std::move(s.ctx));
    }
  }
  ~ThreadSlots() {
    for (auto& s : slots) give_back(s);
  }
};

std::atomic<uint64_t> g_next_owner{1};

}  // namespace

// ---- Impl --------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  std::string path;
  uint64_t owner = g_next_owner.fetch_add(1);
  std::shared_ptr<CtxPool> pool = std::make_shared<CtxPool>();

  // Model.
  MergeTable merges;
  int32_t byte_id[256];
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::unordered_map<std::string, int32_t> bytes_to_id;  // for ignore_merges
  std::unordered_map<std::string, int32_t> vocab;        // token string form -> id
  std::vector<std::string> id_bytes;                     // decode table
  std::vector<bool> id_known;
  int64_t size = 0;

  // Added tokens.
  std::vector<AddedSpec> added;
  std::unordered_map<std::string, int32_t> added_ids;
  AddedMatcher raw_matcher, norm_matcher;

  // Normalizer: utf8proc option sets applied in order.
  std::vector<int> normalizers;
  bool nfc_only = false;

  // Pre-tokenizer.
  std::vector<std::unique_ptr<Regex>> regexes;
  std::vector<PreStep> steps;

  [[noreturn]] void unsupported(const std::string& what) const {
    QT_FAIL(path, ": unsupported tokenizer.json feature: ", what);
  }

  int compile_regex(const std::string& pattern, const char* what) {
    const std::string pcre = onig_compatible_pattern(pattern);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre.data()), pcre.size(), PCRE2_UTF | PCRE2_UCP,
                                     &err, &err_off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      QT_FAIL(path, ": ", what, " regex does not compile (", reinterpret_cast<const char*>(msg), " at offset ",
              err_off, "): ", pattern);
    }
    auto r = std::make_unique<Regex>();
    r->code = code;
    r->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    regexes.push_back(std::move(r));
    return static_cast<int>(regexes.size()) - 1;
  }

  void parse_normalizer(const json& n) {
    if (n.is_null()) return;
    const std::string type = n.value("type", "");
    if (type == "NFC") normalizers.push_back(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    else if (type == "NFD") normalizers.push_back(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    else if (type == "NFKC") normalizers.push_back(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    else if (type == "NFKD") normalizers.push_back(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
    else if (type == "Sequence") {
      for (const auto& s : n.at("normalizers")) parse_normalizer(s);
    } else {
      unsupported("normalizer '" + type + "'");
    }
  }

  void parse_pre_tokenizer(const json& p) {
    if (p.is_null()) unsupported("no pre_tokenizer (a byte-level BPE needs ByteLevel)");
    const std::string type = p.value("type", "");
    if (!steps.empty() && steps.back().kind == PreStep::ByteLevel)
      unsupported("pre_tokenizer '" + type + "' after ByteLevel");
    if (type == "Sequence") {
      for (const auto& s : p.at("pretokenizers")) parse_pre_tokenizer(s);
    } else if (type == "Split") {
      const std::string behavior = p.value("behavior", "");
      if (behavior != "Isolated") unsupported("Split behavior '" + behavior + "' (only Isolated)");
      if (p.value("invert", false)) unsupported("Split with invert=true");
      const json& pat = p.at("pattern");
      PreStep s{PreStep::Split};
      if (pat.contains("Regex")) s.regex = compile_regex(pat["Regex"].get<std::string>(), "Split");
      else if (pat.contains("String")) s.regex = compile_regex(escape_literal(pat["String"].get<std::string>()), "Split");
      else unsupported("Split pattern " + pat.dump());
      steps.push_back(s);
    } else if (type == "ByteLevel") {
      PreStep s{PreStep::ByteLevel};
      s.add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) s.regex = compile_regex(kGpt2Regex, "ByteLevel");
      steps.push_back(s);
    } else {
      unsupported("pre_tokenizer '" + type + "'");
    }
  }

  void load(const std::string& file) {
    path = file;
    std::ifstream in(file, std::ios::binary);
    QT_CHECK(in, file, ": cannot open tokenizer file");
    std::stringstream ss;
    ss << in.rdbuf();
    json j;
    try {
      j = json::parse(ss.str());
    } catch (const json::exception& e) {
      QT_FAIL(file, ": malformed JSON: ", e.what());
    }
    try {
      load_json(j);
    } catch (const json::exception& e) {
      QT_FAIL(file, ": unexpected tokenizer.json structure: ", e.what());
    }
  }

  void load_json(const json& j) {
    QT_CHECK(j.is_object() && j.contains("model"), path, ": not a tokenizer.json (no \"model\")");
    const json& m = j["model"];
    const std::string mtype = m.value("type", "BPE");
    if (mtype != "BPE") unsupported("model type '" + mtype + "' (only BPE)");
    if (m.contains("dropout") && !m["dropout"].is_null()) unsupported("BPE dropout");
    if (m.value("byte_fallback", false)) unsupported("BPE byte_fallback");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && !m[k].is_null() && !m[k].get<std::string>().empty()) unsupported(std::string("BPE ") + k);
    fuse_unk = m.value("fuse_unk", false);
    ignore_merges = m.value("ignore_merges", false);

    // Byte-level alphabet: code point string -> byte.
    const auto& alpha = byte_level_alphabet();
    std::unordered_map<std::string, int> char_byte;
    for (int b = 0; b < 256; ++b) char_byte[alpha[static_cast<size_t>(b)]] = b;
    auto token_bytes = [&](const std::string& tok) {  // HF ByteLevel decoder for one token
      std::string out;
      size_t i = 0;
      const auto* s = reinterpret_cast<const unsigned char*>(tok.data());
      while (i < tok.size()) {
        const size_t b = i;
        utf8_next(s, i);
        auto it = char_byte.find(tok.substr(b, i - b));
        if (it == char_byte.end()) return tok;  // not byte-level: the token's own UTF-8
        out += static_cast<char>(it->second);
      }
      return out;
    };

    const json& v = m.at("vocab");
    QT_CHECK(v.is_object(), path, ": model.vocab is not an object");
    int64_t max_id = -1;
    vocab.reserve(v.size());
    for (auto it = v.begin(); it != v.end(); ++it) {
      const int64_t id = it.value().get<int64_t>();
      QT_CHECK(id >= 0 && id < (int64_t{1} << 31), path, ": vocab id ", id, " of '", it.key(), "' out of range");
      vocab[it.key()] = static_cast<int32_t>(id);
      max_id = std::max(max_id, id);
    }
    for (const auto& a : j.value("added_tokens", json::array())) {
      AddedSpec t;
      const int64_t id = a.at("id").get<int64_t>();
      QT_CHECK(id >= 0 && id < (int64_t{1} << 31), path, ": added token id ", id, " out of range");
      t.id = static_cast<int32_t>(id);
      t.content = a.at("content").get<std::string>();
      QT_CHECK(utf8_first_invalid(t.content) == std::string_view::npos, path, ": added token ", id, " is not UTF-8");
      t.special = a.value("special", false);
      t.single_word = a.value("single_word", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.normalized = a.value("normalized", !t.special);
      max_id = std::max(max_id, id);
      added.push_back(std::move(t));
    }
    size = max_id + 1;
    id_bytes.assign(static_cast<size_t>(size), std::string());
    id_known.assign(static_cast<size_t>(size), false);
    for (const auto& [tok, id] : vocab) {
      id_bytes[static_cast<size_t>(id)] = token_bytes(tok);
      id_known[static_cast<size_t>(id)] = true;
      if (ignore_merges) bytes_to_id[id_bytes[static_cast<size_t>(id)]] = id;
    }
    for (int b = 0; b < 256; ++b) {
      auto it = vocab.find(alpha[static_cast<size_t>(b)]);
      byte_id[b] = it == vocab.end() ? -1 : it->second;
    }
    if (m.contains("unk_token") && !m["unk_token"].is_null()) {
      const std::string unk = m["unk_token"].get<std::string>();
      auto it = vocab.find(unk);
      QT_CHECK(it != vocab.end(), path, ": unk_token '", unk, "' is not in the vocabulary");
      unk_id = it->second;
    }

    // Merges: "a b" strings or ["a", "b"] pairs.
    const json& ms = m.at("merges");
    merges.reserve(ms.size());
    int32_t rank = 0;
    for (const auto& e : ms) {
      std::string a, b;
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        QT_CHECK(sp != std::string::npos, path, ": merge ", rank, " '", s, "' has no space");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        QT_CHECK(e.is_array() && e.size() == 2, path, ": merge ", rank, " is neither \"a b\" nor [a, b]");
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      }
      auto ia = vocab.find(a), ib = vocab.find(b), ic = vocab.find(a + b);
      QT_CHECK(ia != vocab.end() && ib != vocab.end(), path, ": merge ", rank, " uses a token not in the vocabulary: '",
               ia == vocab.end() ? a : b, "'");
      QT_CHECK(ic != vocab.end(), path, ": merge ", rank, " result '", a + b, "' is not in the vocabulary");
      merges.put(ia->second, ib->second, {rank, ic->second});
      ++rank;
    }

    // Added tokens: decode bytes, lookup maps, matchers.
    for (size_t i = 0; i < added.size(); ++i) {
      const auto& t = added[i];
      id_bytes[static_cast<size_t>(t.id)] = token_bytes(t.content);
      id_known[static_cast<size_t>(t.id)] = true;
      added_ids.emplace(t.content, t.id);
    }
    if (j.contains("normalizer")) parse_normalizer(j["normalizer"]);
    nfc_only = normalizers.size() == 1 && normalizers[0] == (UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    for (size_t i = 0; i < added.size(); ++i) {
      const auto& t = added[i];
      if (!t.normalized) {
        raw_matcher.add(t.content, static_cast<int32_t>(i));
      } else {
        std::string n = t.content;
        normalize_owned(n);
        norm_matcher.add(n, static_cast<int32_t>(i));
      }
    }

    parse_pre_tokenizer(j.value("pre_tokenizer", json()));
    if (steps.empty() || steps.back().kind != PreStep::ByteLevel)
      unsupported("pre_tokenizer without a final ByteLevel (not a byte-level BPE)");
    const json& d = j.value("decoder", json());
    if (d.is_null() || d.value("type", "") != "ByteLevel")
      unsupported("decoder " + (d.is_null() ? std::string("null") : "'" + d.value("type", "") + "'") + " (only ByteLevel)");
  }

  // ---- normalization ----

  void normalize_owned(std::string& s) const {
    for (int opts : normalizers) {
      utf8proc_uint8_t* out = nullptr;
      const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                                  &out, static_cast<utf8proc_option_t>(opts));
      QT_CHECK(n >= 0, path, ": normalization failed: ", utf8proc_errmsg(n));
      s.assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
      std::free(out);
    }
  }

  // True when s is certainly unchanged by the normalizers: ASCII always is; for NFC alone, so is
  // text made of NFC-safe code points.
  bool normalization_safe(std::string_view s) const {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const auto& bits = nfc_safe_bits();
    size_t i = 0;
    while (i < s.size()) {
      if (p[i] < 0x80) {
        ++i;
        continue;
      }
      if (!nfc_only) return false;
      const uint32_t cp = utf8_next(p, i);
      if (cp >= kSafeLimit || !((bits[cp >> 6] >> (cp & 63)) & 1)) return false;
    }
    return true;
  }

  // Normalized form of s (s itself when unchanged, else ctx.normalized).
  std::string_view normalize(std::string_view s, ThreadCtx& ctx) const {
    if (normalizers.empty() || normalization_safe(s)) return s;
    std::string& buf = ctx.normalized;
    buf.assign(s.data(), s.size());
    for (int opts : normalizers) {
      auto& cps = ctx.cps;
      const auto o = static_cast<utf8proc_option_t>(opts);
      utf8proc_ssize_t n = 0;
      for (;;) {
        n = utf8proc_decompose(reinterpret_cast<const utf8proc_uint8_t*>(buf.data()), static_cast<utf8proc_ssize_t>(buf.size()),
                               cps.data(), static_cast<utf8proc_ssize_t>(cps.size()), o);
        QT_CHECK(n >= 0, path, ": normalization failed: ", utf8proc_errmsg(n));
        if (static_cast<size_t>(n) <= cps.size()) break;
        cps.resize(static_cast<size_t>(n));
      }
      n = utf8proc_normalize_utf32(cps.data(), n, o);
      QT_CHECK(n >= 0, path, ": normalization failed: ", utf8proc_errmsg(n));
      buf.clear();
      for (utf8proc_ssize_t k = 0; k < n; ++k) {
        utf8proc_uint8_t enc[4];
        const auto len = utf8proc_encode_char(cps[static_cast<size_t>(k)], enc);
        buf.append(reinterpret_cast<const char*>(enc), static_cast<size_t>(len));
      }
    }
    return buf;
  }

  // ---- added tokens: HF AddedVocabulary::find_matches ----

  void find_added(const AddedMatcher& matcher, std::string_view s, std::vector<Split>& out) const {
    out.clear();
    size_t from = 0, start_offset = 0, mstart, mlen;
    int32_t idx;
    while (matcher.next(s, from, &mstart, &mlen, &idx)) {
      from = mstart + mlen;
      const AddedSpec& t = added[static_cast<size_t>(idx)];
      size_t start = mstart, stop = mstart + mlen;
      if (t.single_word) {
        const bool start_space = start == 0 || !is_word_char(utf8_last(s.substr(0, start)));
        const bool stop_space = stop == s.size() || !is_word_char(utf8_first(s.substr(stop)));
        if (!start_space || !stop_space) continue;
      }
      if (t.lstrip) {
        size_t ns = start;
        while (ns > 0) {
          size_t b = ns - 1;
          while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xc0) == 0x80) --b;
          if (!is_white_space(utf8_first(s.substr(b)))) break;
          ns = b;
        }
        start = std::max(ns, start_offset);
      }
      if (t.rstrip) {
        while (stop < s.size()) {
          size_t k = stop;
          const uint32_t cp = utf8_next(reinterpret_cast<const unsigned char*>(s.data()), k);
          if (!is_white_space(cp)) break;
          stop = k;
        }
      }
      if (start_offset < start) out.push_back({-1, start_offset, start});
      out.push_back({t.id, start, stop});
      start_offset = stop;
    }
    if (start_offset != s.size()) out.push_back({-1, start_offset, s.size()});
  }

  // ---- pre-tokenizer + BPE ----

  void run_steps(size_t step, std::string_view piece, ThreadCtx& ctx, std::vector<int32_t>& out) const {
    if (piece.empty()) return;
    if (step == steps.size()) {
      bpe(piece, ctx, out);
      return;
    }
    const PreStep& st = steps[step];
    if (st.kind == PreStep::ByteLevel && st.add_prefix_space && piece[0] != ' ') {
      std::string spaced = " ";
      spaced.append(piece.data(), piece.size());
      split_and_run(step, st.regex, spaced, ctx, out);
      return;
    }
    split_and_run(step, st.regex, piece, ctx, out);
  }

  void split_and_run(size_t step, int regex, std::string_view piece, ThreadCtx& ctx, std::vector<int32_t>& out) const {
    if (regex < 0) {
      run_steps(step + 1, piece, ctx, out);
      return;
    }
    const Regex& re = *regexes[static_cast<size_t>(regex)];
    pcre2_match_data* md = ctx.match_data[static_cast<size_t>(regex)];
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
    size_t prev = 0, offset = 0;
    while (offset <= piece.size()) {
      const int rc = re.jit ? pcre2_jit_match(re.code, subject, piece.size(), offset, 0, md, ctx.mcontext)
                            : pcre2_match(re.code, subject, piece.size(), offset, PCRE2_NO_UTF_CHECK, md, ctx.mcontext);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        QT_FAIL(path, ": regex match failed: ", reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t s = ov[0], e = ov[1];
      if (prev != s) run_steps(step + 1, piece.substr(prev, s - prev), ctx, out);
      if (e > s) run_steps(step + 1, piece.substr(s, e - s), ctx, out);
      prev = e;
      if (e == s) {  // empty match: step one code point
        if (e >= piece.size()) break;
        size_t k = e;
        utf8_next(subject, k);
        offset = k;
      } else {
        offset = e;
      }
    }
    if (prev < piece.size()) run_steps(step + 1, piece.substr(prev), ctx, out);
  }

  void bpe(std::string_view word, ThreadCtx& ctx, std::vector<int32_t>& out) const {
    if (word.size() == 1 && byte_id[static_cast<unsigned char>(word[0])] >= 0) {
      out.push_back(byte_id[static_cast<unsigned char>(word[0])]);
      return;
    }
    const bool cacheable = word.size() <= WordCache::kMaxWordBytes;
    uint64_t h = 0;
    if (cacheable) {
      h = WordCache::hash(word);
      if (ctx.cache.find(word, h, out)) return;
    }
    std::vector<int32_t>& ids = ctx.word_ids;
    ids.clear();
    bpe_merge(word, ctx, ids);
    if (cacheable) ctx.cache.insert(word, h, ids.data(), ids.size());
    out.insert(out.end(), ids.begin(), ids.end());
  }

  // HF Word::merge_all: repeatedly merge the adjacent pair of lowest (rank, position).
  void bpe_merge(std::string_view word, ThreadCtx& ctx, std::vector<int32_t>& ids) const {
    if (ignore_merges) {
      auto it = bytes_to_id.find(std::string(word));
      if (it != bytes_to_id.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    auto& sym = ctx.symbols;
    sym.clear();
    bool last_unk = false;
    for (unsigned char c : word) {
      int32_t id = byte_id[c];
      if (id < 0) {
        if (unk_id < 0) continue;
        if (fuse_unk && last_unk) continue;
        id = unk_id;
        last_unk = true;
      } else {
        last_unk = false;
      }
      const auto n = static_cast<int32_t>(sym.size());
      sym.push_back({id, n - 1, n + 1});
    }
    if (sym.empty()) return;
    sym.back().next = -1;
    auto& heap = ctx.heap;
    heap.clear();
    for (size_t i = 0; i + 1 < sym.size(); ++i)
      if (const auto* m = merges.get(sym[i].id, sym[i + 1].id)) heap.push_back({m->rank, static_cast<int32_t>(i), m->id});
    std::make_heap(heap.begin(), heap.end(), HeapGreater());
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), HeapGreater());
      const HeapEntry top = heap.back();
      heap.pop_back();
      Symbol& cur = sym[static_cast<size_t>(top.pos)];
      if (cur.id < 0 || cur.next < 0) continue;
      const Symbol right = sym[static_cast<size_t>(cur.next)];
      const auto* m = merges.get(cur.id, right.id);
      if (!m || m->id != top.id) continue;  // stale entry
      sym[static_cast<size_t>(cur.next)].id = -1;
      cur.id = top.id;
      cur.next = right.next;
      if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = top.pos;
      if (cur.prev >= 0) {
        if (const auto* pm = merges.get(sym[static_cast<size_t>(cur.prev)].id, cur.id)) {
          heap.push_back({pm->rank, cur.prev, pm->id});
          std::push_heap(heap.begin(), heap.end(), HeapGreater());
        }
      }
      if (cur.next >= 0) {
        if (const auto* nm = merges.get(cur.id, sym[static_cast<size_t>(cur.next)].id)) {
          heap.push_back({nm->rank, top.pos, nm->id});
          std::push_heap(heap.begin(), heap.end(), HeapGreater());
        }
      }
    }
    for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) ids.push_back(sym[static_cast<size_t>(i)].id);
  }

  // ---- thread contexts ----

  std::unique_ptr<ThreadCtx> make_ctx() const {
    auto ctx = std::make_unique<ThreadCtx>();
    for (const auto& r : regexes) ctx->match_data.push_back(pcre2_match_data_create_from_pattern(r->code, nullptr));
    ctx->mcontext = pcre2_match_context_create(nullptr);
    ctx->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    QT_CHECK(ctx->mcontext && ctx->jit_stack, "out of memory creating regex match context");
    pcre2_jit_stack_assign(ctx->mcontext, nullptr, ctx->jit_stack);
    return ctx;
  }

  ThreadCtx& thread_ctx() const {
    thread_local ThreadSlots tls;
    auto& slots = tls.slots;
    for (auto& s : slots)
      if (s.owner == owner) return *s.ctx;
    std::unique_ptr<ThreadCtx> ctx;
    {
      std::lock_guard<std::mutex> lock(pool->mu);
      if (!pool->free.empty()) {
        ctx = std::move(pool->free.back());
        pool->free.pop_back();
      }
    }
    if (!ctx) ctx = make_ctx();
    if (slots.size() >= 4) {
      ThreadSlots::give_back(slots.front());
      slots.erase(slots.begin());
    }
    slots.push_back({owner, pool, std::move(ctx)});
    return *slots.back().ctx;
  }

  void encode_into(std::string_view text, bool fix_utf8, std::vector<int32_t>& out) const {
    std::string fixed;
    const size_t bad = utf8_first_invalid(text);
    if (bad != std::string_view::npos) {
      QT_CHECK(fix_utf8, "invalid UTF-8 at byte offset ", bad, " of the text to tokenize");
      fixed = utf8_lossy(text);
      text = fixed;
    }
    ThreadCtx& ctx = thread_ctx();
    if (raw_matcher.empty()) {
      encode_unnormalized(text, ctx, out);
      return;
    }
    find_added(raw_matcher, text, ctx.raw_splits);
    for (const Split& sp : ctx.raw_splits) {
      if (sp.token >= 0) out.push_back(sp.token);
      else encode_unnormalized(text.substr(sp.begin, sp.end - sp.begin), ctx, out);
    }
  }

  void encode_unnormalized(std::string_view piece, ThreadCtx& ctx, std::vector<int32_t>& out) const {
    const std::string_view n = normalize(piece, ctx);
    if (norm_matcher.empty()) {
      run_steps(0, n, ctx, out);
      return;
    }
    // ctx.normalized may back n; copy so the recursion below may reuse the buffer.
    const std::string copy(n);
    auto& splits = ctx.norm_splits;
    find_added(norm_matcher, copy, splits);
    const std::vector<Split> local(splits);
    for (const Split& sp : local) {
      if (sp.token >= 0) out.push_back(sp.token);
      else run_steps(0, std::string_view(copy).substr(sp.begin, sp.end - sp.begin), ctx, out);
    }
  }
};

// ---- public API --------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& tokenizer_json_path) {
  auto impl = std::make_unique<Impl>();
  impl->load(tokenizer_json_path);
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool fix_utf8) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  impl_->encode_into(text, fix_utf8, out);
  return out;
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out, bool fix_utf8) const {
  impl_->encode_into(text, fix_utf8, out);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    QT_CHECK(id >= 0 && id < impl_->size && impl_->id_known[static_cast<size_t>(id)], impl_->path,
             ": decode: id ", id, " (position ", i, ") is not in the vocabulary");
    bytes += impl_->id_bytes[static_cast<size_t>(id)];
  }
  if (utf8_first_invalid(bytes) == std::string_view::npos) return bytes;
  return utf8_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const std::string t(token);
  if (auto it = impl_->added_ids.find(t); it != impl_->added_ids.end()) return it->second;
  if (auto it = impl_->vocab.find(t); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

int64_t Tokenizer::vocab_size() const { return impl_->size; }

bool Tokenizer::is_added_token(std::string_view token) const {
  return impl_->added_ids.count(std::string(token)) > 0;
}

bool Tokenizer::has_id(int32_t id) const {
  return id >= 0 && id < impl_->size && impl_->id_known[static_cast<size_t>(id)];
}

void check_chat_tokenizer(const Tokenizer& tok) {
  for (const char* marker : {"<|im_start|>", "<|im_end|>"})
    QT_CHECK(tok.is_added_token(marker), tok.path(), ": the tokenizer has no added token '", marker,
             "': the Qwen3.5 chat template (ChatML) needs <|im_start|> and <|im_end|> as added tokens, or its markers "
             "would be split into bytes. Use the model's own tokenizer.json, or pre-tokenized data (data.schema: tokenized)");
}
const std::string& Tokenizer::path() const { return impl_->path; }

std::string Tokenizer::fix_utf8(std::string_view text) { return utf8_lossy(text); }

}  // namespace qt
