// Bad checkpoints: each must fail with a clear message naming the file and the tensor / field.
// The broken folders are made in a temp dir from the tiny fixture.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace lilac {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const std::string kTiny = std::string(LILAC_SHARED_DIR) + "/fixtures/tiny/mlx4";
const std::string P = "language_model.model.";

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("lilac_bad_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(kTiny + "/config.json", dir_ + "/config.json");
    std::string raw = read_text_file(kTiny + "/model.safetensors");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(raw[size_t(i)]);
    header_ = json::parse(raw.substr(8, n));
    data_ = raw.substr(8 + n);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string st() const { return dir_ + "/model.safetensors"; }

  // Writes header_ + data_ (raw: no consistency fixing, so a header can lie).
  void write_raw(size_t truncate_to = std::string::npos) {
    std::string h = header_.dump();
    while (h.size() % 8) h.push_back(' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[size_t(i)] = char((h.size() >> (8 * i)) & 0xff);
    out += h + data_;
    if (truncate_to != std::string::npos) out.resize(truncate_to);
    write_text_file(st(), out);
  }

  // Rebuilds a valid file from the fixture's tensors after `edit` (name -> (dtype, shape, bytes)).
  struct T {
    std::string dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  void write_tensors(const std::function<void(std::map<std::string, T>&)>& edit) {
    std::map<std::string, T> ts;
    for (auto& [name, v] : header_.items()) {
      if (name == "__metadata__") continue;
      auto off = v["data_offsets"];
      ts[name] = {v["dtype"], v["shape"].get<std::vector<int64_t>>(),
                  data_.substr(off[0].get<size_t>(), off[1].get<size_t>() - off[0].get<size_t>())};
    }
    edit(ts);
    json h = json::object();
    std::string data;
    for (auto& [name, t] : ts) {
      h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
      data += t.bytes;
    }
    header_ = h;
    data_ = data;
    write_raw();
  }

  void edit_config(const std::function<void(json&)>& edit) {
    json c = json::parse(read_text_file(dir_ + "/config.json"));
    edit(c);
    write_text_file(dir_ + "/config.json", c.dump());
  }

  // load_model must throw an Error whose message contains every one of `parts`.
  void expect_error(std::vector<std::string> parts) {
    try {
      load_model(dir_);
      ADD_FAILURE() << "load_model succeeded";
    } catch (const Error& e) {
      for (auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "message: " << e.what() << "\nmissing: " << p;
    }
  }

  std::string dir_;
  json header_;
  std::string data_;
};

TEST_F(BadInput, UnchangedCopyLoads) {
  write_raw();
  auto w = load_model(dir_);
  EXPECT_EQ(w->layers.size(), 4u);
}

TEST_F(BadInput, MissingFolderOrFiles) {
  try {
    load_model(dir_ + "/nope");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir_ + "/nope/config.json"), std::string::npos) << e.what();
  }
  expect_error({"no model.safetensors or model.safetensors.index.json in " + dir_});
}

TEST_F(BadInput, MissingShardOfIndex) {
  write_text_file(dir_ + "/model.safetensors.index.json",
                  json{{"weight_map", {{P + "norm.weight", "model-00001-of-00002.safetensors"}}}}.dump());
  expect_error({"cannot open " + dir_ + "/model-00001-of-00002.safetensors"});
}

TEST_F(BadInput, TruncatedFile) {
  write_raw(8 + header_.dump().size() + data_.size() - 1000);
  // Some tensor stored near the end now lies past it; the message names it.
  expect_error({st() + ": tensor '" + P, "lie outside the file", "file truncated?"});
}

TEST_F(BadInput, TruncatedHeader) {
  write_raw(100);
  expect_error({st(), "header length", "exceeds the file size"});
  write_raw(5);
  expect_error({st(), "truncated"});
}

TEST_F(BadInput, HeaderLiesAboutSize) {
  const std::string name = P + "layers.0.linear_attn.A_log";
  header_[name]["shape"] = {5};  // 5 x F32 = 20 bytes, the offsets span 16
  write_raw();
  expect_error({st(), "tensor '" + name + "'", "span 16 bytes", "needs 20"});
}

// Found by the safetensors fuzz target: 2^62 F32 elements are 2^64 bytes, which wrapped to 0, so an empty
// span passed for them and a reader of numel() elements ran off the mapping.
TEST_F(BadInput, HeaderShapeWhoseBytesWrap) {
  const std::string name = P + "layers.0.linear_attn.A_log";
  header_[name]["shape"] = {uint64_t(1) << 62};
  header_[name]["data_offsets"] = {0, 0};
  write_raw();
  expect_error({st(), "tensor '" + name + "'", "more than 2^64 bytes"});
}

TEST_F(BadInput, HeaderOffsetsOverlap) {
  const std::string a = P + "layers.0.linear_attn.A_log", b = P + "layers.0.linear_attn.dt_bias";
  header_[b]["dtype"] = "F32";  // 4 x F32 = 16 bytes, placed on top of A_log's
  header_[b]["shape"] = {4};
  header_[b]["data_offsets"] = header_[a]["data_offsets"];
  write_raw();
  expect_error({st(), "overlap", a, b});
}

TEST_F(BadInput, HeaderOffsetsReversed) {
  const std::string a = P + "norm.weight";
  auto off = header_[a]["data_offsets"];
  header_[a]["data_offsets"] = {off[1], off[0]};
  write_raw();
  expect_error({st(), "tensor '" + a + "'", "reversed"});
}

TEST_F(BadInput, HeaderNotJson) {
  std::string bad = "{\"a\": ";
  std::string out(8, '\0');
  out[0] = char(bad.size());
  write_text_file(st(), out + bad);
  expect_error({st(), "invalid safetensors header JSON"});
}

TEST_F(BadInput, UnknownDtype) {
  const std::string a = P + "layers.0.input_layernorm.weight";
  header_[a]["dtype"] = "F8_E4M3";
  write_raw();
  expect_error({st(), "tensor '" + a + "'", "unsupported dtype 'F8_E4M3'"});
}

TEST_F(BadInput, WrongDtypeForRole) {
  const std::string a = P + "layers.1.mlp.gate.scales";
  write_tensors([&](auto& ts) { ts[a].dtype = "F16"; });
  expect_error({st(), "tensor '" + a + "'", "dtype F16, expected BF16"});
}

TEST_F(BadInput, MissingTensor) {
  const std::string a = P + "layers.1.linear_attn.dt_bias";
  write_tensors([&](auto& ts) { ts.erase(a); });
  expect_error({"missing tensor '" + a + "'", dir_});
}

TEST_F(BadInput, MissingScales) {
  const std::string a = P + "layers.2.mlp.shared_expert.up_proj.biases";
  write_tensors([&](auto& ts) { ts.erase(a); });
  expect_error({"missing tensor '" + a + "'"});
}

TEST_F(BadInput, UnusedTensor) {
  const std::string a = P + "layers.0.self_attn.extra.weight";
  write_tensors([&](auto& ts) { ts[a] = {"F32", {2}, std::string(8, '\0')}; });
  expect_error({st(), "unused tensor '" + a + "'"});
}

TEST_F(BadInput, SkippedPrefixesAreNotUnused) {
  write_tensors([&](auto& ts) {
    ts["vision_tower.blocks.0.attn.weight"] = {"BF16", {2}, std::string(4, '\0')};
    ts["model.visual.merger.weight"] = {"BF16", {2}, std::string(4, '\0')};
  });
  EXPECT_NO_THROW(load_model(dir_));
}

TEST_F(BadInput, ShapeMismatchInFile) {
  const std::string a = P + "layers.0.linear_attn.A_log";
  header_[a]["shape"] = {2, 2};  // same bytes, wrong shape
  write_raw();
  expect_error({st(), "tensor '" + a + "'", "has shape [2, 2], expected [4]"});
}

TEST_F(BadInput, ShapeMismatchWithConfig) {
  write_raw();
  edit_config([](json& c) { c["text_config"]["moe_intermediate_size"] = 192; });
  expect_error({st(), "tensor '" + P + "layers.0.mlp.switch_mlp.gate_proj.weight'", "has shape [16, 128, 32]",
                "expected [16, 192, 32]"});
}

TEST_F(BadInput, WrongBitsInConfig) {
  write_raw();
  edit_config([](json& c) { c["quantization"].erase("language_model.model.layers.0.mlp.gate"); });
  expect_error({st(), "tensor '" + P + "layers.0.mlp.gate.weight'", "has shape [16, 64]", "expected [16, 32]",
                "at 4 bits"});
}

TEST_F(BadInput, FewerLayersInConfigLeavesTensorsUnused) {
  write_raw();
  edit_config([](json& c) {
    c["text_config"]["num_hidden_layers"] = 3;
    c["text_config"]["layer_types"] = {"linear_attention", "linear_attention", "linear_attention"};
  });
  expect_error({st(), "unused tensor '" + P + "layers.3."});
}

TEST_F(BadInput, UnsupportedConfigValues) {
  write_raw();
  const std::string cfg = dir_ + "/config.json";
  const std::string orig = read_text_file(cfg);
  struct Case {
    std::function<void(json&)> edit;
    std::string message;
  } cases[] = {
      {[](json& c) { c["text_config"]["model_type"] = "mixtral"; }, "field 'text_config.model_type' = 'mixtral' is not supported"},
      {[](json& c) { c["text_config"]["rope_parameters"]["rope_type"] = "yarn"; },
       "field 'text_config.rope_parameters.rope_type' = 'yarn' is not supported"},
      {[](json& c) { c["text_config"]["rope_scaling"] = {{"type", "dynamic"}}; },
       "field 'text_config.rope_scaling.type' = 'dynamic' is not supported"},
      {[](json& c) { c["text_config"]["hidden_act"] = "gelu_pytorch_tanh"; }, "field 'text_config.hidden_act'"},
      {[](json& c) { c["text_config"]["attention_bias"] = true; }, "field 'text_config.attention_bias' = true is not supported"},
      {[](json& c) { c["quantization"]["mode"] = "mxfp4"; }, "field 'quantization'.mode = \"mxfp4\" is not supported"},
  };
  for (auto& k : cases) {
    write_text_file(cfg, orig);
    edit_config(k.edit);
    expect_error({cfg, k.message});
  }
}

}  // namespace
}  // namespace lilac
