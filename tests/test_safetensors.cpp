// SafetensorsFile and Checkpoint: round trips, slices, dtype conversion against IEEE
// bit patterns, every malformed-header case the loader promises to reject, and the
// sharded stories260k checkpoint from shared/.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "loader/checkpoint.h"
#include "loader/safetensors.h"
#include "tests/test_helpers.h"

namespace fs = std::filesystem;
using linnet::Checkpoint;
using linnet::DType;
using linnet::SafetensorsFile;
using linnet::Slice2D;
using linnet::TensorSpec;

namespace {

using linnet::test::error_of;

/// A fresh directory under the system temp dir, removed at scope end.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path = fs::temp_directory_path() /
           ("linnet-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
            std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

/// Raw safetensors bytes: length prefix, header text, data.
std::string raw_file(const std::string& header, const std::string& data = {}) {
  return le64(header.size()) + header + data;
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

/// Builds a well-formed file: tensors laid out back to back in the order given.
struct FileBuilder {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
           const std::string& bytes) {
    header[name] = {{"dtype", dtype},
                    {"shape", shape},
                    {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data += bytes;
  }
  std::string bytes() const { return raw_file(header.dump(), data); }
};

#define EXPECT_CONTAINS(haystack, needle)                                              \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos)                     \
      << "message: \"" << (haystack) << "\"\n does not contain \"" << (needle) << "\""

/// The error message of opening a file made of `bytes`; it must name the file.
std::string open_error(const std::string& bytes) {
  TempDir dir;
  const fs::path p = dir.path / "bad.safetensors";
  write_file(p, bytes);
  const std::string msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_CONTAINS(msg, p.string());
  return msg;
}

std::vector<float> read_all(const SafetensorsFile& f, const std::string& name, Slice2D s) {
  const linnet::TensorInfo* info = f.find(name);
  EXPECT_NE(info, nullptr) << name;
  const int64_t rows = info->shape.size() == 2 ? s.row_end - s.row_begin : 1;
  std::vector<float> out(static_cast<std::size_t>(rows * (s.col_end - s.col_begin)), -999.0f);
  f.read_f32(*info, s, out.data());
  return out;
}

std::string shared_dir() {
  const char* s = std::getenv("LINNET_SHARED_DIR");
  return s ? s : "";
}

#define REQUIRE_SHARED_DIR()                                                       \
  if (shared_dir().empty())                                                        \
  GTEST_SKIP() << "LINNET_SHARED_DIR is not set (ctest sets it to the shared/ "     \
                  "reference data directory); the stories260k checkpoint lives there"

}  // namespace

// ---------------------------------------------------------------- good files

TEST(Safetensors, RoundTripF32WithSlices) {
  TempDir dir;
  FileBuilder b;
  std::vector<float> m(12);
  for (int i = 0; i < 12; ++i) m[i] = static_cast<float>(i) + 0.5f;  // [3, 4]
  b.add("m", "F32", {3, 4}, bytes_of(m));
  b.add("v", "F32", {5}, bytes_of(std::vector<float>{10, 11, 12, 13, 14}));
  b.add("s", "F32", {}, bytes_of(std::vector<float>{42}));
  b.header["__metadata__"] = {{"format", "pt"}};
  const fs::path p = dir.path / "good.safetensors";
  write_file(p, b.bytes());

  SafetensorsFile f(p);
  EXPECT_EQ(f.path(), p);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.find("nope"), nullptr);
  const linnet::TensorInfo* mi = f.find("m");
  ASSERT_NE(mi, nullptr);
  EXPECT_EQ(mi->dtype, DType::kF32);
  EXPECT_EQ(mi->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(mi->numel(), 12);
  EXPECT_EQ(mi->begin, 0u);
  EXPECT_EQ(mi->end, 48u);

  EXPECT_EQ(read_all(f, "m", {0, 3, 0, 4}), m);
  EXPECT_EQ(read_all(f, "m", {1, 3, 0, 4}),
            (std::vector<float>{4.5f, 5.5f, 6.5f, 7.5f, 8.5f, 9.5f, 10.5f, 11.5f}));
  EXPECT_EQ(read_all(f, "m", {0, 3, 1, 3}),
            (std::vector<float>{1.5f, 2.5f, 5.5f, 6.5f, 9.5f, 10.5f}));
  EXPECT_EQ(read_all(f, "m", {2, 3, 3, 4}), (std::vector<float>{11.5f}));
  EXPECT_EQ(read_all(f, "v", {0, 0, 1, 4}), (std::vector<float>{11, 12, 13}));
  EXPECT_EQ(read_all(f, "s", {0, 0, 0, 1}), (std::vector<float>{42}));
  EXPECT_EQ(f.find("s")->numel(), 1);

  SafetensorsFile moved(std::move(f));
  EXPECT_EQ(read_all(moved, "v", {0, 0, 0, 5}), (std::vector<float>{10, 11, 12, 13, 14}));
}

TEST(Safetensors, F16ConvertsIeeeHalfIncludingSpecials) {
  // Bit patterns and values from IEEE 754 binary16.
  const std::vector<uint16_t> bits = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x03FF,
                                      0x0400, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x3555};
  TempDir dir;
  FileBuilder b;
  b.add("h", "F16", {2, 6}, bytes_of(bits));
  const fs::path p = dir.path / "f16.safetensors";
  write_file(p, b.bytes());
  SafetensorsFile f(p);
  EXPECT_EQ(f.find("h")->dtype, DType::kF16);
  const std::vector<float> v = read_all(f, "h", {0, 2, 0, 6});
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -2.0f);
  EXPECT_EQ(v[2], 0.5f);
  EXPECT_EQ(v[3], 65504.0f);
  EXPECT_EQ(v[4], std::ldexp(1.0f, -24));             // smallest subnormal
  EXPECT_EQ(v[5], std::ldexp(1023.0f, -24));          // largest subnormal
  EXPECT_EQ(v[6], std::ldexp(1.0f, -14));             // smallest normal
  EXPECT_EQ(v[7], 0.0f);
  EXPECT_TRUE(std::signbit(v[7]));                    // -0
  EXPECT_EQ(v[8], std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[9], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(v[10]));
  EXPECT_EQ(v[11], 0.333251953125f);                  // nearest half to 1/3

  // Column slice of the second row, then of both rows.
  EXPECT_EQ(read_all(f, "h", {1, 2, 0, 2}), (std::vector<float>{std::ldexp(1.0f, -14), -0.0f}));
  const std::vector<float> cols = read_all(f, "h", {0, 2, 4, 5});
  EXPECT_EQ(cols[0], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isnan(cols[1]));
}

TEST(Safetensors, BF16ConvertsTopHalfOfF32) {
  const std::vector<uint16_t> bits = {0x3F80, 0xC020, 0x4049, 0x0000, 0x7F80, 0xFF80};
  TempDir dir;
  FileBuilder b;
  b.add("pad", "F16", {1}, bytes_of(std::vector<uint16_t>{0}));  // odd-aligned data start
  b.add("b", "BF16", {3, 2}, bytes_of(bits));
  const fs::path p = dir.path / "bf16.safetensors";
  write_file(p, b.bytes());
  SafetensorsFile f(p);
  EXPECT_EQ(f.find("b")->dtype, DType::kBF16);
  const std::vector<float> v = read_all(f, "b", {0, 3, 0, 2});
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -2.5f);
  EXPECT_EQ(v[2], 3.140625f);
  EXPECT_EQ(v[3], 0.0f);
  EXPECT_EQ(v[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[5], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(read_all(f, "b", {1, 3, 1, 2}),
            (std::vector<float>{0.0f, -std::numeric_limits<float>::infinity()}));
}

TEST(Safetensors, F8E4M3WidensExactlyAndIntegersAreReadAsStored) {
  // Bit patterns and values of OCP FP8 e4m3 ("E4M3FN": bias 7, no infinities, S.1111.111
  // the only NaN): 1, -2, 448 (the largest), 2^-6 (smallest normal), 2^-9 (smallest
  // subnormal), 7 * 2^-9 (largest subnormal), -0, NaN, 1.125, 1.25 * 2^-5 (0x12).
  const std::vector<uint8_t> bits = {0x38, 0xC0, 0x7E, 0x08, 0x01, 0x07, 0x80, 0x7F, 0x39, 0x12};
  const std::vector<int32_t> words = {-1, 0x12345678, 7, INT32_MIN};
  TempDir dir;
  FileBuilder b;
  b.add("w", "F8_E4M3", {2, 5}, bytes_of(bits));
  b.add("packed", "I32", {2, 2}, bytes_of(words));
  b.add("shape", "I64", {2}, bytes_of(std::vector<int64_t>{64, 112}));
  const fs::path p = dir.path / "fp8.safetensors";
  write_file(p, b.bytes());
  SafetensorsFile f(p);
  EXPECT_EQ(f.find("w")->dtype, DType::kF8E4M3);
  const std::vector<float> v = read_all(f, "w", {0, 2, 0, 5});
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -2.0f);
  EXPECT_EQ(v[2], 448.0f);
  EXPECT_EQ(v[3], std::ldexp(1.0f, -6));
  EXPECT_EQ(v[4], std::ldexp(1.0f, -9));
  EXPECT_EQ(v[5], std::ldexp(7.0f, -9));
  EXPECT_EQ(v[6], 0.0f);
  EXPECT_TRUE(std::signbit(v[6]));
  EXPECT_TRUE(std::isnan(v[7]));
  EXPECT_EQ(v[8], 1.125f);
  EXPECT_EQ(v[9], std::ldexp(1.25f, -5));
  std::vector<int32_t> got(2);
  f.read(*f.find("packed"), Slice2D{0, 2, 1, 2}, DType::kI32, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{0x12345678, INT32_MIN}));
  std::vector<int64_t> shape(2);
  f.read(*f.find("shape"), Slice2D{0, 1, 0, 2}, DType::kI64, shape.data());
  EXPECT_EQ(shape, (std::vector<int64_t>{64, 112}));
  std::vector<float> as_float(4);
  EXPECT_CONTAINS(error_of([&] { f.read(*f.find("packed"), Slice2D{0, 2, 0, 2}, DType::kF32, as_float.data()); }),
                  "integer tensors are read as stored");
  EXPECT_CONTAINS(error_of([&] { f.read(*f.find("w"), Slice2D{0, 1, 0, 4}, DType::kI32, as_float.data()); }),
                  "integer tensors are read as stored");
}

TEST(Safetensors, DTypeNamesAndSizes) {
  EXPECT_STREQ(linnet::safetensors_dtype_name(DType::kF32), "F32");
  EXPECT_STREQ(linnet::safetensors_dtype_name(DType::kF16), "F16");
  EXPECT_STREQ(linnet::safetensors_dtype_name(DType::kBF16), "BF16");
  EXPECT_EQ(linnet::dtype_size(DType::kF32), 4u);
  EXPECT_EQ(linnet::dtype_size(DType::kF16), 2u);
  EXPECT_EQ(linnet::dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(linnet::shape_str({2, 3}), "[2, 3]");
  EXPECT_EQ(linnet::shape_str({}), "[]");
}

TEST(Safetensors, BadSliceAndRankAreRefusedByName) {
  TempDir dir;
  FileBuilder b;
  b.add("m", "F32", {2, 2}, bytes_of(std::vector<float>{1, 2, 3, 4}));
  b.add("cube", "F32", {1, 1, 2}, bytes_of(std::vector<float>{1, 2}));
  const fs::path p = dir.path / "x.safetensors";
  write_file(p, b.bytes());
  SafetensorsFile f(p);
  std::vector<float> out(16);
  std::string msg = error_of([&] { f.read_f32(*f.find("m"), {0, 3, 0, 2}, out.data()); });
  EXPECT_CONTAINS(msg, "'m'");
  EXPECT_CONTAINS(msg, p.string());
  msg = error_of([&] { f.read_f32(*f.find("m"), {0, 1, 1, 0}, out.data()); });
  EXPECT_CONTAINS(msg, "slice");
  msg = error_of([&] { f.read_f32(*f.find("cube"), {0, 1, 0, 1}, out.data()); });
  EXPECT_CONTAINS(msg, "'cube'");
  EXPECT_CONTAINS(msg, "[1, 1, 2]");
}

// ---------------------------------------------------------------- malformed files

TEST(SafetensorsMalformed, MissingFile) {
  TempDir dir;
  const fs::path p = dir.path / "absent.safetensors";
  EXPECT_CONTAINS(error_of([&] { SafetensorsFile f(p); }), p.string());
}

TEST(SafetensorsMalformed, ShorterThanEightBytes) {
  EXPECT_CONTAINS(open_error("abcde"), "5 bytes");
  EXPECT_CONTAINS(open_error(""), ">= 8 bytes");
}

TEST(SafetensorsMalformed, DataCutShort) {
  FileBuilder b;
  b.add("w", "F32", {4}, bytes_of(std::vector<float>{1, 2, 3, 4}));
  std::string bytes = b.bytes();
  bytes.resize(bytes.size() - 4);
  const std::string msg = open_error(bytes);
  EXPECT_CONTAINS(msg, "'w'");
  EXPECT_CONTAINS(msg, "data area");
}

TEST(SafetensorsMalformed, HeaderLengthPastEnd) {
  const std::string msg = open_error(le64(1000) + "{}");
  EXPECT_CONTAINS(msg, "past the end");
}

TEST(SafetensorsMalformed, HeaderLengthOverCap) {
  const std::string msg = open_error(le64(SafetensorsFile::kMaxHeaderBytes + 1) + "{}");
  EXPECT_CONTAINS(msg, "cap");
  EXPECT_CONTAINS(msg, std::to_string(SafetensorsFile::kMaxHeaderBytes + 1));
  EXPECT_CONTAINS(open_error(le64(~0ull) + "{}"), "cap");
}

TEST(SafetensorsMalformed, HeaderNotJson) {
  EXPECT_CONTAINS(open_error(raw_file("{\"w\": {\"dtype\": ")), "not valid JSON");
  EXPECT_CONTAINS(open_error(raw_file("")), "not valid JSON");
  EXPECT_CONTAINS(open_error(raw_file("{} trailing")), "not valid JSON");
}

TEST(SafetensorsMalformed, HeaderNotAnObject) {
  EXPECT_CONTAINS(open_error(raw_file("[1, 2]")), "not a JSON object");
  EXPECT_CONTAINS(open_error(raw_file("\"w\"")), "not a JSON object");
}

TEST(SafetensorsMalformed, EmptyObjectWithPaddingIsFine) {
  TempDir dir;
  const fs::path p = dir.path / "empty.safetensors";
  write_file(p, raw_file("{}      "));
  SafetensorsFile f(p);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_TRUE(f.metadata().empty());
}

TEST(SafetensorsHeader, InMemoryParseMatchesTheMappedFile) {
  FileBuilder b;
  b.add("w", "F32", {2, 3}, bytes_of(std::vector<float>{1, 2, 3, 4, 5, 6}));
  b.add("v", "BF16", {2}, std::string(4, '\x3f'));
  b.header["__metadata__"] = {{"format", "pt"}};
  const std::string bytes = b.bytes();
  const auto h = linnet::parse_safetensors_header(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()), "mem");
  EXPECT_EQ(h.header_bytes, b.header.dump().size());
  EXPECT_EQ(h.metadata.at("format"), "pt");
  TempDir dir;
  write_file(dir.path / "m.safetensors", bytes);
  const SafetensorsFile f(dir.path / "m.safetensors");
  ASSERT_EQ(h.tensors.size(), f.tensors().size());
  for (const auto& [name, t] : f.tensors()) {
    const linnet::TensorInfo& m = h.tensors.at(name);
    EXPECT_EQ(m.shape, t.shape);
    EXPECT_EQ(m.begin, t.begin);
    EXPECT_EQ(m.end, t.end);
    EXPECT_EQ(m.dtype, t.dtype);
  }
  // Errors name the `where` given, and nothing past the span is read.
  const std::string cut = bytes.substr(0, bytes.size() - 1);
  EXPECT_CONTAINS(error_of([&] {
                    linnet::parse_safetensors_header(
                        std::span<const std::byte>(reinterpret_cast<const std::byte*>(cut.data()), cut.size()),
                        "in memory");
                  }),
                  "in memory: tensor 'v': data_offsets run past the data area");
  EXPECT_CONTAINS(error_of([&] { linnet::parse_safetensors_header({}, "in memory"); }), "in memory: file too short");
}

TEST(SafetensorsMalformed, UnsupportedDtypeNamesTensorAndDtype) {
  for (const std::string dtype : {"I16", "F64", "U8", "BOOL", "F8_E5M2", "Q4_K"}) {
    const std::string header = "{\"ids\": {\"dtype\": \"" + dtype +
                               "\", \"shape\": [1], \"data_offsets\": [0, 8]}}";
    const std::string msg = open_error(raw_file(header, std::string(8, '\0')));
    EXPECT_CONTAINS(msg, "unsupported dtype " + dtype);
    EXPECT_CONTAINS(msg, "'ids'");
    EXPECT_CONTAINS(msg, "F32, F16, BF16, F8_E4M3, I32, I64");
  }
}

TEST(SafetensorsMalformed, EntryFieldsMissingOrMistyped) {
  const std::string d(16, '\0');
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": {"dtype": "F32", "shape": [4]}})", d)),
                  "data_offsets");
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": {"shape": [4], "data_offsets": [0, 16]}})", d)),
                  "dtype");
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": {"dtype": 3, "shape": [4], "data_offsets": [0, 16]}})", d)),
                  "dtype is not a string");
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}})", d)),
                  "shape is not an array");
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", d)),
                  "non-negative");
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": {"dtype": "F32", "shape": [4.0], "data_offsets": [0, 16]}})", d)),
                  "non-negative");
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0]}})", d)),
                  "data_offsets");
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}})", d)),
                  "begin > end");
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [-1, 15]}})", d)),
                  "data_offsets");
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": [1, 2]})", d)), "'w'");
}

TEST(SafetensorsMalformed, DeeplyNestedValuesGiveAnErrorNotACrash) {
  // Refused by a scan before parsing: a valid header nests 3 deep (object > entry >
  // shape), and parsing megabytes of '[' would cost gigabytes.
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": {"dtype": "F32", "shape": )" + deep +
                                      R"(, "data_offsets": [0, 0]}})")),
                  "nested too deeply");
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": )" + deep + "}")), "nested too deeply");
  // 64 MiB of '[' (under the 100 MiB header cap) is refused at the first excess byte.
  const std::string msg = open_error(raw_file(std::string(64u << 20, '[')));
  EXPECT_CONTAINS(msg, "at most 4 levels");
  EXPECT_CONTAINS(msg, "byte offset 4");
  // Depth 4 passes the scan and fails as a bad shape; brackets inside strings don't count.
  EXPECT_CONTAINS(open_error(raw_file(R"({"w": {"dtype": "F32", "shape": [[1]], "data_offsets": [0, 4]}})",
                                     std::string(4, '\0'))),
                  "'w'");
  TempDir dir;
  write_file(dir.path / "s.safetensors",
             raw_file(R"({"__metadata__": {"note": "[[[[[{{{{{ \"[[[[[["}})"));
  EXPECT_EQ(SafetensorsFile(dir.path / "s.safetensors").metadata().at("note"), "[[[[[{{{{{ \"[[[[[[");
}

TEST(SafetensorsMalformed, NotARegularFileIsRefusedWithoutBlocking) {
  TempDir dir;
  const fs::path fifo = dir.path / "fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string msg = error_of([&] { SafetensorsFile f(fifo); });  // used to block in open()
  EXPECT_CONTAINS(msg, fifo.string());
  EXPECT_CONTAINS(msg, "not a regular file");
  EXPECT_CONTAINS(msg, "FIFO");
  const fs::path sub = dir.path / "dir.safetensors";
  fs::create_directory(sub);
  msg = error_of([&] { SafetensorsFile f(sub); });
  EXPECT_CONTAINS(msg, sub.string());
  EXPECT_CONTAINS(msg, "directory");
}

TEST(SafetensorsMalformed, SizeDoesNotMatchShape) {
  const std::string msg = open_error(
      raw_file(R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})",
               std::string(12, '\0')));
  EXPECT_CONTAINS(msg, "'w'");
  EXPECT_CONTAINS(msg, "16 bytes");
  EXPECT_CONTAINS(msg, "12 bytes");
  // A shape whose element count overflows 64 bits must not wrap around to a match.
  EXPECT_CONTAINS(open_error(raw_file(
                      R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})")),
                  "'w'");
}

TEST(SafetensorsMalformed, RangeOutsideDataArea) {
  const std::string msg = open_error(
      raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
               std::string(12, '\0')));
  EXPECT_CONTAINS(msg, "'b'");
  EXPECT_CONTAINS(msg, "end <= 12");
}

TEST(SafetensorsMalformed, OverlappingRanges) {
  const std::string msg = open_error(
      raw_file(R"({"b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
                   "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
               std::string(24, '\0')));
  EXPECT_CONTAINS(msg, "overlap");
  EXPECT_CONTAINS(msg, "'a'");
  EXPECT_CONTAINS(msg, "'b'");
}

TEST(SafetensorsMalformed, MetadataNotAStringMap) {
  EXPECT_CONTAINS(open_error(raw_file(R"({"__metadata__": {"format": "pt", "step": 3}})")),
                  "'step'");
  EXPECT_CONTAINS(open_error(raw_file(R"({"__metadata__": ["pt"]})")), "__metadata__");
  EXPECT_CONTAINS(open_error(raw_file(R"({"__metadata__": null})")), "__metadata__");
  EXPECT_CONTAINS(open_error(raw_file(R"({"__metadata__": {"nested": {"a": "b"}}})")), "'nested'");
  EXPECT_CONTAINS(open_error(raw_file(R"({"__metadata__": "pt"})")), "__metadata__");
}

// Issue 14: a repeated key would let the last entry win silently (JSON parsers keep it),
// so the same tensor name given twice, or a key repeated inside an entry or __metadata__,
// is refused naming the key.
TEST(SafetensorsMalformed, DuplicateKeysAreRefused) {
  const std::string entry = R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})";
  const std::string twice = R"({"w": )" + entry + R"(, "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  std::string msg = open_error(raw_file(twice, std::string(8, '\0')));
  EXPECT_CONTAINS(msg, "duplicate key \"w\"");
  EXPECT_CONTAINS(msg, ".safetensors");
  msg = open_error(raw_file(R"({"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})",
                            std::string(4, '\0')));
  EXPECT_CONTAINS(msg, "duplicate key \"dtype\" in \"w\"");
  msg = open_error(raw_file(R"({"__metadata__": {"format": "pt", "format": "np"}})"));
  EXPECT_CONTAINS(msg, "duplicate key \"format\" in \"__metadata__\"");
  msg = open_error(raw_file(R"({"__metadata__": {}, "__metadata__": {"format": "pt"}})"));
  EXPECT_CONTAINS(msg, "duplicate key \"__metadata__\"");
  // The same keys in different objects are fine.
  TempDir dir;
  write_file(dir.path / "ok.safetensors",
             raw_file(R"({"a": )" + entry + R"(, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                      std::string(8, '\0')));
  EXPECT_EQ(SafetensorsFile(dir.path / "ok.safetensors").tensors().size(), 2u);
}

// ---------------------------------------------------------------- checkpoints

TEST(Checkpoint, SingleFile) {
  TempDir dir;
  FileBuilder b;
  b.add("a.weight", "F32", {2, 3}, bytes_of(std::vector<float>{1, 2, 3, 4, 5, 6}));
  b.add("b.weight", "BF16", {2}, bytes_of(std::vector<uint16_t>{0x3F80, 0xC020}));
  write_file(dir.path / "model.safetensors", b.bytes());
  const Checkpoint ck = Checkpoint::open(dir.path);
  EXPECT_EQ(ck.dir(), dir.path);
  const auto [info, file] = ck.find("a.weight");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(file->path(), dir.path / "model.safetensors");
  EXPECT_EQ(ck.find("c.weight").first, nullptr);
  std::vector<float> out(2);
  ck.read_f32("a.weight", {0, 2, 2, 3}, out.data());
  EXPECT_EQ(out, (std::vector<float>{3, 6}));
  ck.read_f32("b.weight", {0, 0, 0, 2}, out.data());
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.5f}));
  const std::string msg = error_of([&] { ck.read_f32("c.weight", {0, 1, 0, 1}, out.data()); });
  EXPECT_CONTAINS(msg, "'c.weight'");
}

TEST(Checkpoint, NeitherFileNamesDirAndBothNames) {
  TempDir dir;
  const std::string msg = error_of([&] { Checkpoint::open(dir.path); });
  EXPECT_CONTAINS(msg, dir.path.string());
  EXPECT_CONTAINS(msg, "model.safetensors.index.json");
  EXPECT_CONTAINS(msg, "model.safetensors ");
}

TEST(Checkpoint, ShardedStories260k) {
  REQUIRE_SHARED_DIR();
  const fs::path dir = fs::path(shared_dir()) / "models" / "stories260k";
  const Checkpoint ck = Checkpoint::open(dir);
  std::ifstream idx(dir / "model.safetensors.index.json");
  const nlohmann::json index = nlohmann::json::parse(idx);
  for (const auto& [name, shard] : index["weight_map"].items()) {
    const auto [info, file] = ck.find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(file->path().filename(), shard.get<std::string>()) << name;
  }
  EXPECT_EQ(ck.find("model.norm.weight").second->path().filename(),
            "model-00002-of-00002.safetensors");

  // Compare a column slice with the bytes read straight from the shard file.
  const auto [info, file] = ck.find("model.layers.2.self_attn.o_proj.weight");
  ASSERT_EQ(info->shape, (std::vector<int64_t>{64, 64}));
  ASSERT_EQ(info->dtype, DType::kF32);
  std::ifstream raw(file->path(), std::ios::binary);
  uint64_t n = 0;
  raw.read(reinterpret_cast<char*>(&n), 8);
  std::vector<float> whole(64 * 64);
  raw.seekg(static_cast<std::streamoff>(8 + n + info->begin));
  raw.read(reinterpret_cast<char*>(whole.data()), 64 * 64 * 4);
  std::vector<float> got(3 * 5);
  ck.read_f32(info->name, {10, 13, 20, 25}, got.data());
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 5; ++c) EXPECT_EQ(got[r * 5 + c], whole[(10 + r) * 64 + 20 + c]);

  // The model's full tensor list (shapes from config.json: hidden 64, 4 kv heads x
  // head_dim 8, intermediate 172, vocab 512, tied lm_head) matches with none unused.
  std::vector<TensorSpec> specs = {{"model.embed_tokens.weight", {512, 64}},
                                   {"model.norm.weight", {64}}};
  for (int l = 0; l < 5; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    specs.push_back({p + "input_layernorm.weight", {64}});
    specs.push_back({p + "post_attention_layernorm.weight", {64}});
    specs.push_back({p + "self_attn.q_proj.weight", {64, 64}});
    specs.push_back({p + "self_attn.k_proj.weight", {32, 64}});
    specs.push_back({p + "self_attn.v_proj.weight", {32, 64}});
    specs.push_back({p + "self_attn.o_proj.weight", {64, 64}});
    specs.push_back({p + "mlp.gate_proj.weight", {172, 64}});
    specs.push_back({p + "mlp.up_proj.weight", {172, 64}});
    specs.push_back({p + "mlp.down_proj.weight", {64, 172}});
  }
  EXPECT_TRUE(ck.validate(specs).empty());
}

/// A two-shard directory: shard a holds x, shard b holds y.
void write_two_shards(const fs::path& dir) {
  FileBuilder a, b;
  a.add("x", "F32", {2}, bytes_of(std::vector<float>{1, 2}));
  b.add("y", "F32", {3}, bytes_of(std::vector<float>{3, 4, 5}));
  write_file(dir / "a.safetensors", a.bytes());
  write_file(dir / "b.safetensors", b.bytes());
}

TEST(Checkpoint, IndexWithShards) {
  TempDir dir;
  write_two_shards(dir.path);
  write_file(dir.path / "model.safetensors.index.json",
             R"({"metadata": {}, "weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
  const Checkpoint ck = Checkpoint::open(dir.path);
  std::vector<float> out(3);
  ck.read_f32("y", {0, 0, 0, 3}, out.data());
  EXPECT_EQ(out, (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(ck.find("x").second->path(), dir.path / "a.safetensors");
}

TEST(Checkpoint, IndexNamingMissingShard) {
  TempDir dir;
  write_two_shards(dir.path);
  write_file(dir.path / "model.safetensors.index.json",
             R"({"weight_map": {"x": "a.safetensors", "z": "c.safetensors"}})");
  const std::string msg = error_of([&] { Checkpoint::open(dir.path); });
  EXPECT_CONTAINS(msg, "c.safetensors");
  EXPECT_CONTAINS(msg, "model.safetensors.index.json");
}

TEST(Checkpoint, IndexMappingTensorToFileThatLacksIt) {
  TempDir dir;
  write_two_shards(dir.path);
  write_file(dir.path / "model.safetensors.index.json",
             R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors"}})");
  const std::string msg = error_of([&] { Checkpoint::open(dir.path); });
  EXPECT_CONTAINS(msg, "'y'");
  EXPECT_CONTAINS(msg, (dir.path / "a.safetensors").string());
}

TEST(Checkpoint, MalformedIndex) {
  TempDir dir;
  write_two_shards(dir.path);
  const fs::path index = dir.path / "model.safetensors.index.json";
  write_file(index, "{\"weight_map\": ");
  EXPECT_CONTAINS(error_of([&] { Checkpoint::open(dir.path); }), index.string());
  write_file(index, R"({"metadata": {}})");
  EXPECT_CONTAINS(error_of([&] { Checkpoint::open(dir.path); }), "weight_map");
  write_file(index, R"({"weight_map": {"x": 7}})");
  EXPECT_CONTAINS(error_of([&] { Checkpoint::open(dir.path); }), "'x'");
  write_file(index, R"({"weight_map": {"x": "../a.safetensors"}})");
  EXPECT_CONTAINS(error_of([&] { Checkpoint::open(dir.path); }), "../a.safetensors");
}

TEST(Checkpoint, ShardNameWithNulIsRefused) {
  TempDir dir;
  write_two_shards(dir.path);
  // Truncated at the NUL, this would silently open a.safetensors.
  write_file(dir.path / "model.safetensors.index.json",
             R"({"weight_map": {"x": "a.safetensors\u0000junk", "y": "b.safetensors"}})");
  const std::string msg = error_of([&] { Checkpoint::open(dir.path); });
  EXPECT_CONTAINS(msg, "model.safetensors.index.json");
  EXPECT_CONTAINS(msg, "'x'");
  EXPECT_CONTAINS(msg, "NUL");
  EXPECT_CONTAINS(msg, "a.safetensors\\u0000junk");  // quoted, not cut short
}

TEST(Checkpoint, FilesThatAreNotRegularAreNamed) {
  {
    TempDir dir;
    write_two_shards(dir.path);
    const fs::path index = dir.path / "model.safetensors.index.json";
    fs::create_directory(index);
    const std::string msg = error_of([&] { Checkpoint::open(dir.path); });
    EXPECT_CONTAINS(msg, index.string());
    EXPECT_CONTAINS(msg, "not a regular file");
  }
  {
    TempDir dir;
    write_two_shards(dir.path);
    ASSERT_EQ(::mkfifo((dir.path / "model.safetensors.index.json").c_str(), 0600), 0);
    EXPECT_CONTAINS(error_of([&] { Checkpoint::open(dir.path); }), "not a regular file");
  }
  {
    TempDir dir;
    write_two_shards(dir.path);
    const fs::path fifo = dir.path / "c.safetensors";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    write_file(dir.path / "model.safetensors.index.json",
               R"({"weight_map": {"x": "a.safetensors", "z": "c.safetensors"}})");
    const std::string msg = error_of([&] { Checkpoint::open(dir.path); });
    EXPECT_CONTAINS(msg, fifo.string());
    EXPECT_CONTAINS(msg, "not a regular file");
  }
  {
    TempDir dir;
    fs::create_directory(dir.path / "model.safetensors");
    EXPECT_CONTAINS(error_of([&] { Checkpoint::open(dir.path); }), "not a regular file");
  }
}

TEST(Checkpoint, BadShardHeaderNamesShard) {
  TempDir dir;
  write_two_shards(dir.path);
  write_file(dir.path / "b.safetensors", "xyz");
  write_file(dir.path / "model.safetensors.index.json",
             R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
  EXPECT_CONTAINS(error_of([&] { Checkpoint::open(dir.path); }),
                  (dir.path / "b.safetensors").string());
}

TEST(Checkpoint, ValidateReportsAllProblemsInOneError) {
  TempDir dir;
  FileBuilder b;
  b.add("w1", "F32", {2, 3}, bytes_of(std::vector<float>(6)));
  b.add("w2", "F32", {4}, bytes_of(std::vector<float>(4)));
  b.add("extra.b", "F16", {1}, bytes_of(std::vector<uint16_t>(1)));
  b.add("extra.a", "F16", {1}, bytes_of(std::vector<uint16_t>(1)));
  write_file(dir.path / "model.safetensors", b.bytes());
  const Checkpoint ck = Checkpoint::open(dir.path);

  const std::string msg = error_of([&] {
    ck.validate({{"w1", {3, 2}}, {"w2", {4}}, {"missing.weight", {7, 8}}});
  });
  EXPECT_CONTAINS(msg, "missing tensor 'missing.weight'");
  EXPECT_CONTAINS(msg, "[7, 8]");
  EXPECT_CONTAINS(msg, "'w1'");
  EXPECT_CONTAINS(msg, "expected [3, 2], got [2, 3]");
  EXPECT_CONTAINS(msg, (dir.path / "model.safetensors").string());
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 2) << msg;  // one line per problem

  const std::vector<std::string> unused = ck.validate({{"w1", {2, 3}}, {"w2", {4}}});
  EXPECT_EQ(unused, (std::vector<std::string>{"extra.a", "extra.b"}));
}

TEST(Checkpoint, ValidateListsTheFirstProblemsAndCountsAll) {
  TempDir dir;
  FileBuilder b;
  b.add("w", "F32", {1}, bytes_of(std::vector<float>(1)));
  write_file(dir.path / "model.safetensors", b.bytes());
  const Checkpoint ck = Checkpoint::open(dir.path);
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 100000; ++i) {
    std::string name = "t";
    name += std::to_string(i);  // (not "t" + to_string: GCC 12 gives a false -Wrestrict)
    specs.push_back({name, {2}});
  }
  specs.push_back({"w", {3}});
  const std::string msg = error_of([&] { ck.validate(specs); });
  EXPECT_CONTAINS(msg, "(100001 problems)");
  EXPECT_CONTAINS(msg, "missing tensor 't19'");
  EXPECT_EQ(msg.find("'t20'"), std::string::npos);
  EXPECT_CONTAINS(msg, "\n  ... and 99981 more");
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 21) << msg;
  EXPECT_LT(msg.size(), 4000u);
}
