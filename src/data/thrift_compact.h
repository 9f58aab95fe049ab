// Thrift compact protocol: a bounds-checked reader over a byte range and a small writer.
// Parquet stores its footer (FileMetaData) and every page header in this encoding. The reader
// never reads outside [begin, end): every varint, length and list size is checked against the
// bytes that remain, and skipping unknown fields is depth-limited, so corrupt or hostile input
// ends in a qt::Error (with `what` naming the structure being decoded), never a crash.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qt {

// Compact-protocol wire types (the low nibble of a field header).
enum class ThriftType : uint8_t {
  Stop = 0, BoolTrue = 1, BoolFalse = 2, Byte = 3, I16 = 4, I32 = 5, I64 = 6, Double = 7,
  Binary = 8, List = 9, Set = 10, Map = 11, Struct = 12,
};

class ThriftReader {
 public:
  // `what` prefixes every error message ("x.parquet: footer").
  ThriftReader(const uint8_t* begin, const uint8_t* end, std::string what);

  // Struct traversal: begin_struct(), then next_field() until it returns false (STOP), then
  // end_struct(). Field ids are tracked per nesting level as the protocol requires.
  void begin_struct();
  void end_struct();
  // Reads the next field header; false at STOP. id/type are the field's id and wire type.
  bool next_field(int16_t* id, ThriftType* type);

  // Field values; each checks that the wire type matches and names `field` in the error.
  bool read_bool(ThriftType type, const char* field);
  int32_t read_i32(ThriftType type, const char* field);
  int64_t read_i64(ThriftType type, const char* field);
  double read_double(ThriftType type, const char* field);
  std::string_view read_binary(ThriftType type, const char* field);
  // List header: element type and size (size is at most the bytes remaining, so a corrupt size
  // cannot trigger a huge allocation).
  void read_list_header(ThriftType type, const char* field, ThriftType* elem_type, int64_t* size);
  // List elements (no field header).
  int32_t read_list_i32(ThriftType elem_type, const char* field);
  std::string_view read_list_binary(ThriftType elem_type, const char* field);

  // Skips a value of the given type (nested containers included; depth-limited).
  void skip(ThriftType type);

  size_t offset() const { return static_cast<size_t>(pos_ - begin_); }
  size_t remaining() const { return static_cast<size_t>(end_ - pos_); }
  [[noreturn]] void fail(const std::string& msg) const;

 private:
  uint64_t read_varint();
  int64_t read_zigzag();
  uint8_t read_byte();
  void skip_depth(ThriftType type, int depth);
  void expect_type(ThriftType got, ThriftType want, const char* field) const;

  const uint8_t* begin_;
  const uint8_t* pos_;
  const uint8_t* end_;
  std::string what_;
  std::vector<int16_t> last_id_;  // per struct nesting level
  int16_t cur_last_id_ = 0;
};

// Appends compact-protocol bytes to a string. Used by the test writer (and handy for tools).
class ThriftWriter {
 public:
  void begin_struct();
  void end_struct();  // writes STOP
  void field_i32(int16_t id, int32_t v);
  void field_i64(int16_t id, int64_t v);
  void field_bool(int16_t id, bool v);
  void field_double(int16_t id, double v);
  void field_binary(int16_t id, std::string_view v);
  void field_struct_begin(int16_t id);  // follow with fields, then end_struct()
  void field_list_begin(int16_t id, ThriftType elem_type, int64_t size);
  void list_i32(int32_t v) { write_zigzag(v); }
  void list_binary(std::string_view v);
  void list_struct_begin() { begin_struct(); }
  // Raw field header, for tests that need wrong types on purpose.
  void field_header(int16_t id, ThriftType type);
  void raw_varint(uint64_t v) { write_varint(v); }
  void raw_zigzag(int64_t v) { write_zigzag(v); }

  const std::string& bytes() const { return out_; }
  std::string& bytes() { return out_; }

 private:
  void write_varint(uint64_t v);
  void write_zigzag(int64_t v);
  std::string out_;
  std::vector<int16_t> last_id_;
  int16_t cur_last_id_ = 0;
};

}  // namespace qt
