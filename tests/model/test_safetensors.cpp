// safetensors writer + reader: every supported dtype, metadata, sharding, lookups.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "core/bf16.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/safetensors.h"

namespace lilac {
namespace {

namespace fs = std::filesystem;

std::string tmp(const std::string& tag) {
  auto d = fs::temp_directory_path() / ("lilac_st_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

TEST(Safetensors, WriteReadAllDtypes) {
  const std::string d = tmp("dtypes");
  const float f32[3] = {1.5f, -2.25f, 3.0f};
  const uint16_t bf[2] = {f32_to_bf16(0.5f), f32_to_bf16(-7.0f)};
  const uint16_t f16[2] = {0x3c00, 0xc500};  // 1.0, -5.0
  const uint32_t u32[2] = {0xdeadbeefu, 7};
  const int32_t i32[1] = {-9};
  const uint8_t u8[3] = {1, 2, 255};
  const int8_t i8[1] = {-3};
  const int64_t i64[1] = {int64_t(1) << 40};
  std::vector<TensorToWrite> ts = {
      {"f32", DType::F32, {3}, f32, 12}, {"bf", DType::BF16, {1, 2}, bf, 4},  {"f16", DType::F16, {2}, f16, 4},
      {"u32", DType::U32, {2}, u32, 8},  {"i32", DType::I32, {1}, i32, 4},   {"u8", DType::U8, {3}, u8, 3},
      {"i8", DType::I8, {1}, i8, 1},     {"i64", DType::I64, {1}, i64, 8},   {"empty", DType::F32, {0, 4}, nullptr, 0}};
  write_safetensors(d + "/x.safetensors", ts, {{"format", "pt"}});
  SafetensorsFile f(d + "/x.safetensors");
  EXPECT_EQ(f.tensors().size(), ts.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const auto& t = f.tensors();
  EXPECT_EQ(t.at("f32").shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(tensor_to_floats(t.at("f32")), (std::vector<float>{1.5f, -2.25f, 3.0f}));
  EXPECT_EQ(tensor_to_floats(t.at("bf")), (std::vector<float>{0.5f, -7.0f}));
  EXPECT_EQ(tensor_to_floats(t.at("f16")), (std::vector<float>{1.0f, -5.0f}));
  EXPECT_EQ(t.at("bf").shape_str(), "[1, 2]");
  uint32_t u;
  std::memcpy(&u, t.at("u32").data, 4);
  EXPECT_EQ(u, 0xdeadbeefu);
  EXPECT_EQ(t.at("u8").data[2], 255);
  int64_t big;
  std::memcpy(&big, t.at("i64").data, 8);
  EXPECT_EQ(big, int64_t(1) << 40);
  EXPECT_EQ(t.at("empty").numel(), 0);
  EXPECT_THROW(tensor_to_floats(t.at("u32")), Error);
  // The header is padded to 8 bytes, so 4-byte data is aligned in the mapping.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.at("u32").data) % 4, 0u);
  fs::remove_all(d);
}

TEST(Safetensors, ShardedDirectory) {
  const std::string d = tmp("sharded");
  std::vector<std::vector<float>> bufs;
  std::vector<TensorToWrite> ts;
  for (int i = 0; i < 10; ++i) bufs.emplace_back(250, float(i));
  for (int i = 0; i < 10; ++i) ts.push_back({"t" + std::to_string(i), DType::F32, {250}, bufs[i].data(), 1000});
  write_safetensors_sharded(d, ts, 2500);  // 2 tensors per shard
  EXPECT_TRUE(file_exists(d + "/model-00001-of-00005.safetensors"));
  EXPECT_TRUE(file_exists(d + "/model-00005-of-00005.safetensors"));
  TensorSet s = TensorSet::open_dir(d);
  EXPECT_EQ(s.tensors().size(), 10u);
  EXPECT_EQ(s.files().size(), 5u);
  EXPECT_EQ(s.total_bytes(), 10000u);
  EXPECT_EQ(tensor_float_at(s.get("t7"), 100), 7.0f);
  EXPECT_EQ(s.get("t9").file, d + "/model-00005-of-00005.safetensors");
  try {
    s.get("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'nope' in " + d), std::string::npos);
  }
  // An index that points a tensor at the wrong shard is rejected.
  std::string idx = read_text_file(d + "/model.safetensors.index.json");
  auto pos = idx.find("\"t0\": \"model-00001-of-00005.safetensors\"");
  ASSERT_NE(pos, std::string::npos) << idx;
  idx.replace(pos, std::strlen("\"t0\": \"model-00001-of-00005.safetensors\""), "\"t0\": \"model-00002-of-00005.safetensors\"");
  write_text_file(d + "/model.safetensors.index.json", idx);
  try {
    TensorSet::open_dir(d);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 't0' is listed in shard model-00002-of-00005.safetensors"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(d);
}

TEST(Safetensors, DuplicateAcrossShardsRejected) {
  const std::string d = tmp("dup");
  float v[2] = {1, 2};
  write_safetensors(d + "/a.safetensors", {{"x", DType::F32, {2}, v, 8}});
  write_safetensors(d + "/b.safetensors", {{"x", DType::F32, {2}, v, 8}});
  write_text_file(d + "/model.safetensors.index.json",
                  R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
  try {
    TensorSet::open_dir(d);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'x' appears in both"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

TEST(Safetensors, WriterChecksSizes) {
  float v[2] = {1, 2};
  EXPECT_THROW(write_safetensors("/tmp/never.safetensors", {{"x", DType::F32, {3}, v, 8}}), Error);
}

}  // namespace
}  // namespace lilac
