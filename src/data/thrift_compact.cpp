#include "data/thrift_compact.h"

#include <cstring>

#include "core/error.h"

namespace qt {

namespace {
constexpr int kMaxSkipDepth = 32;

const char* type_name(ThriftType t) {
  switch (t) {
    case ThriftType::Stop: return "stop";
    case ThriftType::BoolTrue:
    case ThriftType::BoolFalse: return "bool";
    case ThriftType::Byte: return "byte";
    case ThriftType::I16: return "i16";
    case ThriftType::I32: return "i32";
    case ThriftType::I64: return "i64";
    case ThriftType::Double: return "double";
    case ThriftType::Binary: return "binary";
    case ThriftType::List: return "list";
    case ThriftType::Set: return "set";
    case ThriftType::Map: return "map";
    case ThriftType::Struct: return "struct";
  }
  return "?";
}

bool is_bool(ThriftType t) { return t == ThriftType::BoolTrue || t == ThriftType::BoolFalse; }
}  // namespace

// ---- reader ----------------------------------------------------------------------------------

ThriftReader::ThriftReader(const uint8_t* begin, const uint8_t* end, std::string what)
    : begin_(begin), pos_(begin), end_(end), what_(std::move(what)) {
  if (end_ < begin_) end_ = begin_;
}

void ThriftReader::fail(const std::string& msg) const {
  QT_FAIL(what_, ": corrupt Thrift metadata at byte ", offset(), ": ", msg);
}

uint8_t ThriftReader::read_byte() {
  if (pos_ >= end_) fail("unexpected end of data");
  return *pos_++;
}

uint64_t ThriftReader::read_varint() {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t b = read_byte();
    if (shift == 63 && (b & 0x7e) != 0) fail("varint overflows 64 bits");
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  fail("varint longer than 10 bytes");
}

int64_t ThriftReader::read_zigzag() {
  uint64_t n = read_varint();
  return static_cast<int64_t>(n >> 1) ^ -static_cast<int64_t>(n & 1);
}

void ThriftReader::begin_struct() {
  if (last_id_.size() >= 64) fail("structs nested too deeply");
  last_id_.push_back(cur_last_id_);
  cur_last_id_ = 0;
}

void ThriftReader::end_struct() {
  if (last_id_.empty()) fail("unbalanced struct end");
  cur_last_id_ = last_id_.back();
  last_id_.pop_back();
}

bool ThriftReader::next_field(int16_t* id, ThriftType* type) {
  uint8_t b = read_byte();
  if (b == 0) return false;
  uint8_t t = b & 0x0f;
  if (t > 12 || t == 0) fail(str("invalid field type ", int(t)));
  int delta = b >> 4;
  int64_t fid;
  if (delta != 0) {
    fid = static_cast<int64_t>(cur_last_id_) + delta;
  } else {
    fid = read_zigzag();
  }
  if (fid < -32768 || fid > 32767) fail(str("field id ", fid, " out of range"));
  cur_last_id_ = static_cast<int16_t>(fid);
  *id = cur_last_id_;
  *type = static_cast<ThriftType>(t);
  return true;
}

void ThriftReader::expect_type(ThriftType got, ThriftType want, const char* field) const {
  if (got != want) fail(str("field '", field, "' has type ", type_name(got), ", expected ", type_name(want)));
}

bool ThriftReader::read_bool(ThriftType type, const char* field) {
  if (!is_bool(type)) fail(str("field '", field, "' has type ", type_name(type), ", expected bool"));
  return type == ThriftType::BoolTrue;
}

int32_t ThriftReader::read_i32(ThriftType type, const char* field) {
  expect_type(type, ThriftType::I32, field);
  int64_t v = read_zigzag();
  if (v < INT32_MIN || v > INT32_MAX) fail(str("field '", field, "' value ", v, " does not fit in i32"));
  return static_cast<int32_t>(v);
}

int64_t ThriftReader::read_i64(ThriftType type, const char* field) {
  // Accept i32-encoded values too (same varint encoding, smaller range).
  if (type != ThriftType::I64 && type != ThriftType::I32) expect_type(type, ThriftType::I64, field);
  return read_zigzag();
}

double ThriftReader::read_double(ThriftType type, const char* field) {
  expect_type(type, ThriftType::Double, field);
  if (remaining() < 8) fail("unexpected end of data in double");
  double d;
  std::memcpy(&d, pos_, 8);
  pos_ += 8;
  return d;
}

std::string_view ThriftReader::read_binary(ThriftType type, const char* field) {
  expect_type(type, ThriftType::Binary, field);
  return read_list_binary(ThriftType::Binary, field);
}

void ThriftReader::read_list_header(ThriftType type, const char* field, ThriftType* elem_type, int64_t* size) {
  if (type != ThriftType::List && type != ThriftType::Set) expect_type(type, ThriftType::List, field);
  uint8_t b = read_byte();
  uint8_t t = b & 0x0f;
  if (t > 12 || t == 0) fail(str("list '", field, "' has invalid element type ", int(t)));
  uint64_t n = b >> 4;
  if (n == 15) n = read_varint();
  // Every element takes at least one byte on the wire.
  if (n > remaining()) fail(str("list '", field, "' claims ", n, " elements but only ", remaining(), " bytes remain"));
  *elem_type = static_cast<ThriftType>(t);
  *size = static_cast<int64_t>(n);
}

int32_t ThriftReader::read_list_i32(ThriftType elem_type, const char* field) {
  return read_i32(elem_type, field);
}

std::string_view ThriftReader::read_list_binary(ThriftType elem_type, const char* field) {
  expect_type(elem_type, ThriftType::Binary, field);
  uint64_t n = read_varint();
  if (n > remaining()) fail(str("string '", field, "' of ", n, " bytes runs past the end (", remaining(), " left)"));
  std::string_view s(reinterpret_cast<const char*>(pos_), static_cast<size_t>(n));
  pos_ += n;
  return s;
}

void ThriftReader::skip(ThriftType type) { skip_depth(type, 0); }

void ThriftReader::skip_depth(ThriftType type, int depth) {
  if (depth > kMaxSkipDepth) fail("values nested too deeply");
  switch (type) {
    case ThriftType::Stop: fail("unexpected stop");
    case ThriftType::BoolTrue:
    case ThriftType::BoolFalse: return;  // value is in the field header
    case ThriftType::Byte: read_byte(); return;
    case ThriftType::I16:
    case ThriftType::I32:
    case ThriftType::I64: read_varint(); return;
    case ThriftType::Double:
      if (remaining() < 8) fail("unexpected end of data in double");
      pos_ += 8;
      return;
    case ThriftType::Binary: read_list_binary(ThriftType::Binary, "(skipped)"); return;
    case ThriftType::List:
    case ThriftType::Set: {
      ThriftType et;
      int64_t n;
      read_list_header(type, "(skipped)", &et, &n);
      for (int64_t i = 0; i < n; ++i) {
        if (is_bool(et)) read_byte();  // bools in containers take one byte each
        else skip_depth(et, depth + 1);
      }
      return;
    }
    case ThriftType::Map: {
      uint64_t n = read_varint();
      if (n == 0) return;
      if (n > remaining()) fail(str("map claims ", n, " entries but only ", remaining(), " bytes remain"));
      uint8_t kv = read_byte();
      uint8_t kt = kv >> 4, vt = kv & 0x0f;
      if (kt == 0 || kt > 12 || vt == 0 || vt > 12) fail("invalid map key/value type");
      for (uint64_t i = 0; i < n; ++i) {
        for (uint8_t t : {kt, vt}) {
          if (is_bool(static_cast<ThriftType>(t))) read_byte();
          else skip_depth(static_cast<ThriftType>(t), depth + 1);
        }
      }
      return;
    }
    case ThriftType::Struct: {
      begin_struct();
      int16_t id;
      ThriftType t;
      while (next_field(&id, &t)) skip_depth(t, depth + 1);
      end_struct();
      return;
    }
  }
  fail("invalid type");
}

// ---- writer ----------------------------------------------------------------------------------

void ThriftWriter::write_varint(uint64_t v) {
  while (v >= 0x80) {
    out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out_.push_back(static_cast<char>(v));
}

void ThriftWriter::write_zigzag(int64_t v) {
  write_varint((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63));
}

void ThriftWriter::begin_struct() {
  last_id_.push_back(cur_last_id_);
  cur_last_id_ = 0;
}

void ThriftWriter::end_struct() {
  out_.push_back(0);
  QT_CHECK(!last_id_.empty(), "ThriftWriter: unbalanced end_struct");
  cur_last_id_ = last_id_.back();
  last_id_.pop_back();
}

void ThriftWriter::field_header(int16_t id, ThriftType type) {
  int delta = id - cur_last_id_;
  if (delta > 0 && delta <= 15) {
    out_.push_back(static_cast<char>((delta << 4) | static_cast<int>(type)));
  } else {
    out_.push_back(static_cast<char>(type));
    write_zigzag(id);
  }
  cur_last_id_ = id;
}

void ThriftWriter::field_i32(int16_t id, int32_t v) { field_header(id, ThriftType::I32); write_zigzag(v); }
void ThriftWriter::field_i64(int16_t id, int64_t v) { field_header(id, ThriftType::I64); write_zigzag(v); }
void ThriftWriter::field_bool(int16_t id, bool v) { field_header(id, v ? ThriftType::BoolTrue : ThriftType::BoolFalse); }
void ThriftWriter::field_double(int16_t id, double v) {
  field_header(id, ThriftType::Double);
  char b[8];
  std::memcpy(b, &v, 8);
  out_.append(b, 8);
}
void ThriftWriter::field_binary(int16_t id, std::string_view v) { field_header(id, ThriftType::Binary); list_binary(v); }
void ThriftWriter::list_binary(std::string_view v) {
  write_varint(v.size());
  out_.append(v.data(), v.size());
}
void ThriftWriter::field_struct_begin(int16_t id) {
  field_header(id, ThriftType::Struct);
  begin_struct();
}
void ThriftWriter::field_list_begin(int16_t id, ThriftType elem_type, int64_t size) {
  field_header(id, ThriftType::List);
  if (size < 15) {
    out_.push_back(static_cast<char>((size << 4) | static_cast<int>(elem_type)));
  } else {
    out_.push_back(static_cast<char>(0xf0 | static_cast<int>(elem_type)));
    write_varint(static_cast<uint64_t>(size));
  }
}

}  // namespace qt
