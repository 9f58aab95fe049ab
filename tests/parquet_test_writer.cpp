#include "parquet_test_writer.h"

#include <snappy.h>
#include <zlib.h>
#include <zstd.h>

#include <cstring>
#include <functional>
#include <fstream>
#include <map>

#include "core/error.h"
#include "data/thrift_compact.h"

namespace qt::testing {

using json = nlohmann::json;

PqNode pq_string(const std::string& name, int repetition) { return PqNode{name, repetition, 6, 0, {}}; }
PqNode pq_leaf(const std::string& name, int type, int repetition) { return PqNode{name, repetition, type, -1, {}}; }
PqNode pq_struct(const std::string& name, std::vector<PqNode> children, int repetition) {
  return PqNode{name, repetition, -1, -1, std::move(children)};
}
PqNode pq_list(const std::string& name, PqNode element, int repetition) {
  element.name = "element";
  PqNode list{"list", 2, -1, -1, {std::move(element)}};
  return PqNode{name, repetition, -1, 3, {std::move(list)}};
}
PqNode pq_map(const std::string& name, PqNode value, int repetition) {
  value.name = "value";
  PqNode kv{"key_value", 2, -1, -1, {pq_string("key", 0), std::move(value)}};
  return PqNode{name, repetition, -1, 1, {std::move(kv)}};
}

PqNode pq_ultrachat_schema() {
  PqNode msg = pq_struct("element", {pq_string("content"), pq_string("role")});
  return pq_struct("schema", {pq_string("prompt"), pq_string("prompt_id"), pq_list("messages", msg)}, 0);
}

std::vector<json> pq_ultrachat_rows(int n) {
  static const char* topics[] = {"the history of tea", "Rust lifetimes", "quantum tunnelling", "Grüße aus Köln — ünïcödé",
                                 "日本語のテキスト処理", "emoji 🚀🔥 handling", "", "tabs\tand\nnewlines \"quoted\""};
  std::vector<json> rows;
  for (int i = 0; i < n; ++i) {
    std::string prompt = std::string("Tell me about ") + topics[i % 8] + " (#" + std::to_string(i) + ")";
    if (i % 11 == 5) prompt = "";
    json msgs = json::array();
    int turns = 1 + (i * 7) % 5;
    for (int t = 0; t < turns; ++t) {
      std::string user = t == 0 ? prompt : "follow-up " + std::to_string(t) + " on " + topics[(i + t) % 8];
      std::string reply = "Answer " + std::to_string(i) + "." + std::to_string(t) + ": " + topics[(i * 3 + t) % 8];
      if (i == 13 && t == 0) reply = std::string(70000, 'x') + " long tail ✓";
      if (i % 9 == 4 && t == 1) reply = "";
      msgs.push_back({{"content", user}, {"role", "user"}});
      msgs.push_back({{"content", reply}, {"role", "assistant"}});
    }
    if (i % 6 == 0) msgs.insert(msgs.begin(), json{{"content", "You are helpful."}, {"role", "system"}});
    char id[32];
    std::snprintf(id, sizeof id, "%08x%04d", 0x9e3779b9u * static_cast<unsigned>(i + 1), i);
    rows.push_back({{"prompt", prompt}, {"prompt_id", id}, {"messages", msgs}});
  }
  return rows;
}

namespace {

struct Flat {
  const PqNode* node;
  std::string path;
  int max_def = 0, max_rep = 0;
  std::vector<int> children;  // indices into flat
  int leaf = -1;
  int first_leaf = 0, end_leaf = 0;
};

struct LeafOut {
  std::vector<int> rep, def;
  std::vector<json> values;  // non-null
};

class Shredder {
 public:
  explicit Shredder(const PqNode& root) { flatten(root, -1, ""); }

  std::vector<Flat> flat;
  std::vector<int> leaves;
  std::vector<LeafOut> out;

  void reset() { out.assign(leaves.size(), {}); }

  void shred_row(const json& row) {
    for (int c : flat[0].children) {
      const Flat& f = flat[static_cast<size_t>(c)];
      field(c, row.contains(f.node->name) ? &row[f.node->name] : nullptr, 0, 0);
    }
  }

 private:
  int flatten(const PqNode& n, int parent, const std::string& prefix) {
    int idx = static_cast<int>(flat.size());
    flat.push_back({&n, "", 0, 0, {}, -1, 0, 0});
    if (parent >= 0) {
      const Flat& p = flat[static_cast<size_t>(parent)];
      flat[static_cast<size_t>(idx)].path = prefix.empty() ? n.name : prefix + "." + n.name;
      flat[static_cast<size_t>(idx)].max_def = p.max_def + (n.repetition != 0);
      flat[static_cast<size_t>(idx)].max_rep = p.max_rep + (n.repetition == 2);
    }
    flat[static_cast<size_t>(idx)].first_leaf = static_cast<int>(leaves.size());
    if (n.type >= 0) {
      flat[static_cast<size_t>(idx)].leaf = static_cast<int>(leaves.size());
      leaves.push_back(idx);
    }
    std::string path = flat[static_cast<size_t>(idx)].path;
    for (const PqNode& c : n.children) {
      int ci = flatten(c, idx, path);
      flat[static_cast<size_t>(idx)].children.push_back(ci);
    }
    flat[static_cast<size_t>(idx)].end_leaf = static_cast<int>(leaves.size());
    return idx;
  }

  void emit_empty(int i, int r, int d) {
    const Flat& f = flat[static_cast<size_t>(i)];
    for (int l = f.first_leaf; l < f.end_leaf; ++l) {
      out[static_cast<size_t>(l)].rep.push_back(r);
      out[static_cast<size_t>(l)].def.push_back(d);
    }
  }

  // A field whose parent instance is present at definition level d.
  void field(int i, const json* v, int r, int d) {
    const Flat& f = flat[static_cast<size_t>(i)];
    bool null = v == nullptr || v->is_null();
    if (f.node->repetition == 2) {
      if (null || v->empty()) return emit_empty(i, r, d);
      for (size_t k = 0; k < v->size(); ++k) instance(i, &(*v)[k], k == 0 ? r : f.max_rep);
      return;
    }
    if (null) {
      QT_CHECK(f.node->repetition == 1, "test writer: null for required field ", f.path);
      return emit_empty(i, r, d);
    }
    instance(i, v, r);
  }

  // Node i present at its own max_def.
  void instance(int i, const json* v, int r) {
    const Flat& f = flat[static_cast<size_t>(i)];
    if (f.node->type >= 0) {
      LeafOut& o = out[static_cast<size_t>(f.leaf)];
      o.rep.push_back(r);
      o.def.push_back(f.max_def);
      o.values.push_back(*v);
      return;
    }
    if (f.node->converted == 3 || f.node->converted == 1) {  // LIST / MAP: one repeated child
      int rc = f.children[0];
      const Flat& rf = flat[static_cast<size_t>(rc)];
      json items = json::array();
      if (f.node->converted == 1) {
        for (auto it = v->begin(); it != v->end(); ++it) items.push_back({{"key", it.key()}, {"value", it.value()}});
      } else {
        items = *v;
      }
      if (items.empty()) return emit_empty(rc, r, f.max_def);
      for (size_t k = 0; k < items.size(); ++k) {
        int rr = k == 0 ? r : rf.max_rep;
        if (f.node->converted == 3) field(rf.children[0], &items[k], rr, rf.max_def);
        else instance(rc, &items[k], rr);
      }
      return;
    }
    for (int c : f.children) {
      const std::string& name = flat[static_cast<size_t>(c)].node->name;
      field(c, v->contains(name) ? &(*v)[name] : nullptr, r, f.max_def);
    }
  }
};

void put_u32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }

void put_uleb(std::string* s, uint64_t v) {
  while (v >= 0x80) {
    s->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s->push_back(static_cast<char>(v));
}

int bit_width(uint64_t max_value) {
  int bw = 0;
  while (bw < 32 && (uint64_t{1} << bw) <= max_value) ++bw;
  return bw;
}

// RLE runs for stretches of >= 8 equal values, single bit-packed groups of 8 otherwise.
std::string rle_encode(const std::vector<int>& v, int bw) {
  std::string s;
  size_t i = 0;
  const int vbytes = (bw + 7) / 8;
  while (i < v.size()) {
    size_t j = i;
    while (j < v.size() && v[j] == v[i]) ++j;
    if (j - i >= 8) {
      put_uleb(&s, (j - i) << 1);
      for (int k = 0; k < vbytes; ++k) s.push_back(static_cast<char>((static_cast<uint32_t>(v[i]) >> (8 * k)) & 0xff));
      i = j;
      continue;
    }
    put_uleb(&s, (1 << 1) | 1);
    std::string bytes(static_cast<size_t>(bw), '\0');
    for (size_t k = 0; k < 8; ++k) {
      uint64_t val = i + k < v.size() ? static_cast<uint32_t>(v[i + k]) : 0;
      for (int b = 0; b < bw; ++b) {
        if ((val >> b) & 1) {
          size_t bit = k * static_cast<size_t>(bw) + static_cast<size_t>(b);
          bytes[bit / 8] = static_cast<char>(bytes[bit / 8] | (1 << (bit % 8)));
        }
      }
    }
    s += bytes;
    i += 8;
  }
  return s;
}

void plain_value(std::string* s, int type, const json& v) {
  switch (type) {
    case 1: { int32_t x = v.get<int32_t>(); s->append(reinterpret_cast<const char*>(&x), 4); break; }
    case 2: { int64_t x = v.get<int64_t>(); s->append(reinterpret_cast<const char*>(&x), 8); break; }
    case 4: { float x = v.get<float>(); s->append(reinterpret_cast<const char*>(&x), 4); break; }
    case 5: { double x = v.get<double>(); s->append(reinterpret_cast<const char*>(&x), 8); break; }
    case 6: {
      const std::string& x = v.get_ref<const std::string&>();
      put_u32(s, static_cast<uint32_t>(x.size()));
      *s += x;
      break;
    }
    default: QT_FAIL("test writer: unsupported type ", type);
  }
}

std::string plain_encode(int type, const std::vector<json>& vals) {
  std::string s;
  if (type == 0) {
    s.assign((vals.size() + 7) / 8, '\0');
    for (size_t k = 0; k < vals.size(); ++k)
      if (vals[k].get<bool>()) s[k / 8] = static_cast<char>(s[k / 8] | (1 << (k % 8)));
    return s;
  }
  for (const json& v : vals) plain_value(&s, type, v);
  return s;
}

std::string compress(int codec, const std::string& in) {
  switch (codec) {
    case 1: {
      std::string out;
      snappy::Compress(in.data(), in.size(), &out);
      return out;
    }
    case 6: {
      std::string out(ZSTD_compressBound(in.size()), '\0');
      size_t n = ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 3);
      QT_CHECK(!ZSTD_isError(n), "zstd compress failed");
      out.resize(n);
      return out;
    }
    case 2: {
      z_stream zs{};
      QT_CHECK(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK, "deflateInit2");
      std::string out(deflateBound(&zs, in.size()) + 32, '\0');
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
      zs.avail_in = static_cast<uInt>(in.size());
      zs.next_out = reinterpret_cast<Bytef*>(out.data());
      zs.avail_out = static_cast<uInt>(out.size());
      QT_CHECK(deflate(&zs, Z_FINISH) == Z_STREAM_END, "deflate");
      out.resize(zs.total_out);
      deflateEnd(&zs);
      return out;
    }
    default: return in;  // UNCOMPRESSED, or an unsupported codec number stored raw
  }
}

struct ChunkInfo {
  int64_t num_values = 0, data_offset = 0, dict_offset = -1, compressed = 0, uncompressed = 0;
  std::vector<int> encodings;
};

void write_page(std::string* file, int type, const std::string& raw_levels, const std::string& raw_values,
                const PqWriteOptions& opt, bool corrupt, int delta, const std::function<void(ThriftWriter&)>& sub,
                ChunkInfo* ci) {
  std::string body;
  int64_t uncompressed = static_cast<int64_t>(raw_levels.size() + raw_values.size());
  if (type == 3) {
    body = raw_levels + compress(opt.codec, raw_values);
  } else {
    body = compress(opt.codec, raw_levels + raw_values);
  }
  if (corrupt && !body.empty()) {
    size_t at = type == 3 ? raw_levels.size() : 0;
    if (at < body.size()) body[at] = static_cast<char>(body[at] ^ 0x5a);
  }
  ThriftWriter w;
  w.begin_struct();
  w.field_i32(1, type);
  w.field_i32(2, static_cast<int32_t>(uncompressed + delta));
  w.field_i32(3, static_cast<int32_t>(body.size()));
  sub(w);
  w.end_struct();
  *file += w.bytes();
  *file += body;
  ci->compressed += static_cast<int64_t>(w.bytes().size() + body.size());
  ci->uncompressed += static_cast<int64_t>(w.bytes().size()) + uncompressed;
}

ChunkInfo write_chunk(std::string* file, const Flat& f, const LeafOut& o, const PqWriteOptions& opt) {
  ChunkInfo ci;
  const int type = f.node->type;
  const bool targeted = opt.override_column.empty() || opt.override_column == f.path;
  const bool corrupt = opt.corrupt_page_start && targeted;
  const int delta = targeted ? opt.uncompressed_size_delta : 0;
  const bool dict = opt.dictionary && type != 0;
  std::vector<json> dict_values;
  std::vector<int> indices;
  if (dict) {
    std::map<std::string, int> seen;
    for (const json& v : o.values) {
      auto it = seen.emplace(v.dump(), static_cast<int>(dict_values.size()));
      if (it.second) dict_values.push_back(v);
      indices.push_back(it.first->second);
    }
    ci.dict_offset = static_cast<int64_t>(file->size());
    write_page(file, 2, "", plain_encode(type, dict_values), opt, corrupt, delta,
               [&](ThriftWriter& w) {
                 w.field_struct_begin(7);
                 w.field_i32(1, static_cast<int32_t>(dict_values.size()));
                 w.field_i32(2, 0);
                 w.end_struct();
               },
               &ci);
  }
  ci.data_offset = static_cast<int64_t>(file->size());
  int encoding = dict ? (opt.page_version == 1 && opt.plain_dictionary ? 2 : 8) : 0;
  if (targeted && opt.value_encoding_override >= 0) encoding = opt.value_encoding_override;
  ci.encodings = {0, 3};
  if (dict) ci.encodings.push_back(encoding);
  const int def_bw = bit_width(static_cast<uint64_t>(f.max_def));
  const int rep_bw = bit_width(static_cast<uint64_t>(f.max_rep));
  size_t begin = 0, value_begin = 0;
  const size_t n = o.def.size();
  while (begin < n) {
    size_t end = begin + 1;
    while (end < n && (static_cast<int64_t>(end - begin) < opt.values_per_page || o.rep[end] != 0)) ++end;
    std::vector<int> rep(o.rep.begin() + static_cast<long>(begin), o.rep.begin() + static_cast<long>(end));
    std::vector<int> def(o.def.begin() + static_cast<long>(begin), o.def.begin() + static_cast<long>(end));
    size_t nn = 0, rows = 0, nulls = 0;
    for (size_t k = 0; k < def.size(); ++k) {
      if (def[k] == f.max_def) ++nn;
      else ++nulls;
      if (rep[k] == 0) ++rows;
    }
    std::string values;
    if (dict) {
      std::vector<int> idx(indices.begin() + static_cast<long>(value_begin), indices.begin() + static_cast<long>(value_begin + nn));
      int bw = bit_width(dict_values.empty() ? 0 : dict_values.size() - 1);
      values.push_back(static_cast<char>(bw));
      values += rle_encode(idx, bw);
    } else {
      std::vector<json> vals(o.values.begin() + static_cast<long>(value_begin), o.values.begin() + static_cast<long>(value_begin + nn));
      values = plain_encode(type, vals);
    }
    std::string rep_bytes = f.max_rep > 0 ? rle_encode(rep, rep_bw) : "";
    std::string def_bytes = f.max_def > 0 ? rle_encode(def, def_bw) : "";
    const int nv = static_cast<int>(end - begin);
    if (opt.page_version == 2) {
      write_page(file, 3, rep_bytes + def_bytes, values, opt, corrupt, delta,
                 [&](ThriftWriter& w) {
                   w.field_struct_begin(8);
                   w.field_i32(1, nv);
                   w.field_i32(2, static_cast<int32_t>(nulls));
                   w.field_i32(3, static_cast<int32_t>(rows));
                   w.field_i32(4, encoding);
                   w.field_i32(5, static_cast<int32_t>(def_bytes.size()));
                   w.field_i32(6, static_cast<int32_t>(rep_bytes.size()));
                   w.end_struct();
                 },
                 &ci);
    } else {
      std::string levels;
      if (f.max_rep > 0) { put_u32(&levels, static_cast<uint32_t>(rep_bytes.size())); levels += rep_bytes; }
      if (f.max_def > 0) { put_u32(&levels, static_cast<uint32_t>(def_bytes.size())); levels += def_bytes; }
      write_page(file, 0, levels, values, opt, corrupt, delta,
                 [&](ThriftWriter& w) {
                   w.field_struct_begin(5);
                   w.field_i32(1, nv);
                   w.field_i32(2, encoding);
                   w.field_i32(3, 3);
                   w.field_i32(4, 3);
                   w.end_struct();
                 },
                 &ci);
    }
    ci.num_values += nv;
    value_begin += nn;
    begin = end;
  }
  return ci;
}

void write_schema(ThriftWriter& w, const std::vector<Flat>& flat) {
  for (size_t i = 0; i < flat.size(); ++i) {
    const PqNode& n = *flat[i].node;
    w.list_struct_begin();
    if (n.type >= 0) w.field_i32(1, n.type);
    if (i > 0) w.field_i32(3, n.repetition);
    w.field_binary(4, n.name);
    if (n.type < 0) w.field_i32(5, static_cast<int32_t>(n.children.size()));
    if (n.converted >= 0) w.field_i32(6, n.converted);
    w.end_struct();
  }
}

}  // namespace

std::string pq_write(const PqNode& root, const std::vector<json>& rows, const PqWriteOptions& opt) {
  Shredder sh(root);
  std::string file = "PAR1";
  struct Group {
    int64_t rows;
    std::vector<ChunkInfo> chunks;
  };
  std::vector<Group> groups;
  for (size_t g0 = 0; g0 < rows.size(); g0 += static_cast<size_t>(opt.rows_per_group)) {
    size_t g1 = std::min(rows.size(), g0 + static_cast<size_t>(opt.rows_per_group));
    sh.reset();
    for (size_t r = g0; r < g1; ++r) sh.shred_row(rows[r]);
    Group grp{static_cast<int64_t>(g1 - g0), {}};
    for (size_t l = 0; l < sh.leaves.size(); ++l)
      grp.chunks.push_back(write_chunk(&file, sh.flat[static_cast<size_t>(sh.leaves[l])], sh.out[l], opt));
    groups.push_back(std::move(grp));
  }
  ThriftWriter w;
  w.begin_struct();
  w.field_i32(1, 1);
  w.field_list_begin(2, ThriftType::Struct, static_cast<int64_t>(sh.flat.size()));
  write_schema(w, sh.flat);
  w.field_i64(3, static_cast<int64_t>(rows.size()));
  w.field_list_begin(4, ThriftType::Struct, static_cast<int64_t>(groups.size()));
  for (const Group& g : groups) {
    w.list_struct_begin();
    w.field_list_begin(1, ThriftType::Struct, static_cast<int64_t>(g.chunks.size()));
    int64_t total = 0;
    for (size_t l = 0; l < g.chunks.size(); ++l) {
      const ChunkInfo& c = g.chunks[l];
      const Flat& f = sh.flat[static_cast<size_t>(sh.leaves[l])];
      total += c.uncompressed;
      w.list_struct_begin();
      w.field_i64(2, c.dict_offset >= 0 ? c.dict_offset : c.data_offset);
      w.field_struct_begin(3);
      w.field_i32(1, f.node->type);
      w.field_list_begin(2, ThriftType::I32, static_cast<int64_t>(c.encodings.size()));
      for (int e : c.encodings) w.list_i32(e);
      std::vector<std::string> parts;
      for (size_t a = 0, b; a <= f.path.size(); a = b + 1) {
        b = f.path.find('.', a);
        if (b == std::string::npos) b = f.path.size();
        parts.push_back(f.path.substr(a, b - a));
      }
      w.field_list_begin(3, ThriftType::Binary, static_cast<int64_t>(parts.size()));
      for (const std::string& p : parts) w.list_binary(p);
      w.field_i32(4, opt.codec);
      w.field_i64(5, c.num_values);
      w.field_i64(6, c.uncompressed);
      w.field_i64(7, c.compressed);
      w.field_i64(9, c.data_offset);
      if (c.dict_offset >= 0) w.field_i64(11, c.dict_offset);
      w.end_struct();
      w.end_struct();
    }
    w.field_i64(2, total);
    w.field_i64(3, g.rows);
    w.end_struct();
  }
  w.field_binary(6, "qwentune parquet_test_writer");
  w.end_struct();
  file += w.bytes();
  put_u32(&file, static_cast<uint32_t>(w.bytes().size()));
  file += "PAR1";
  return file;
}

void pq_write_file(const std::string& path, const PqNode& root, const std::vector<json>& rows, const PqWriteOptions& opt) {
  std::string bytes = pq_write(root, rows, opt);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  QT_CHECK(out.good(), path, ": write failed");
}

}  // namespace qt::testing
