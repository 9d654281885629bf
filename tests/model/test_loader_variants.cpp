// Checkpoint variants the loader must accept: MLX without the "language_model." prefix (with vision
// tensors to skip), tied embeddings, a matrix stored unquantized, unaligned tensor data, an
// HF text-only layout ("model.layers.*") with BF16 tensors, and HF experts stored one tensor each.
#include <gtest/gtest.h>


#include <cstring>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/hf_writer.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "model/weight_walk.h"
#include "model/weights.h"
#include "support/model_files.h"

namespace lilac {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const std::string kTiny = std::string(LILAC_SHARED_DIR) + "/fixtures/tiny/mlx4";

std::string temp_dir(const std::string& tag) { return testutil::temp_dir("lilac_variant_", tag); }
using testutil::OwnedTensor;
using testutil::rewrite_model;

std::string strip_prefix(const std::string& n) {
  if (n.rfind("language_model.", 0) == 0) return n.substr(std::strlen("language_model."));
  return n;
}

void expect_same(const ModelWeights& a, const ModelWeights& b) {
  std::vector<WeightRef> ra, rb;
  walk_weights(a, [&](const WeightRef& r) { ra.push_back(r); });
  walk_weights(b, [&](const WeightRef& r) { rb.push_back(r); });
  ASSERT_EQ(ra.size(), rb.size());
  for (size_t i = 0; i < ra.size(); ++i) {
    ASSERT_EQ(ra[i].name, rb[i].name);
    if (ra[i].values) {
      EXPECT_EQ(*ra[i].values, *rb[i].values) << ra[i].name;
      continue;
    }
    const QMatrix& x = ra[i].matrix ? *ra[i].matrix : ra[i].experts->first;
    const QMatrix& y = rb[i].matrix ? *rb[i].matrix : rb[i].experts->first;
    const int64_t n = ra[i].experts ? ra[i].experts->n : 1;
    ASSERT_EQ(x.bits, y.bits) << ra[i].name;
    ASSERT_EQ(x.rows, y.rows);
    ASSERT_EQ(x.cols, y.cols);
    if (x.bits) {
      EXPECT_EQ(0, std::memcmp(x.qweight, y.qweight, size_t(n * x.rows * x.words_per_row()) * 4)) << ra[i].name;
      EXPECT_EQ(0, std::memcmp(x.scales, y.scales, size_t(n * x.rows * x.groups_per_row()) * 2)) << ra[i].name;
      EXPECT_EQ(0, std::memcmp(x.biases, y.biases, size_t(n * x.rows * x.groups_per_row()) * 2)) << ra[i].name;
    } else {
      EXPECT_EQ(0, std::memcmp(x.dense, y.dense, size_t(n * x.rows * x.cols) * 4)) << ra[i].name;
    }
  }
}

TEST(LoaderVariants, MlxWithoutLanguageModelPrefix) {
  auto ref = load_model(kTiny);
  const std::string d = temp_dir("noprefix");
  rewrite_model(kTiny, d, [](std::vector<OwnedTensor>& all) {
    for (auto& o : all) o.name = strip_prefix(o.name);
    all.push_back({"vision_tower.blocks.0.attn.qkv.weight", "BF16", {4}, std::string(8, '\1')});
  });  // config keeps the "language_model." keys in `quantization`: looked up either way
  auto w = load_model(d);
  EXPECT_EQ(w->layers[0].moe.router.bits, 8);
  expect_same(*ref, *w);
  fs::remove_all(d);
}

TEST(LoaderVariants, TiedEmbeddings) {
  const std::string d = temp_dir("tied");
  rewrite_model(
      kTiny, d,
      [](std::vector<OwnedTensor>& all) {
        std::erase_if(all, [](const OwnedTensor& o) { return o.name.rfind("language_model.lm_head.", 0) == 0; });
      },
      [](json& c) { c["text_config"]["tie_word_embeddings"] = true; });
  auto w = load_model(d);
  EXPECT_TRUE(w->config.tie_word_embeddings);
  EXPECT_EQ(w->lm_head.qweight, w->embed.qweight);
  EXPECT_EQ(w->lm_head.rows, 2048);
  // Without the tie, the missing lm_head is an error naming it.
  const std::string d2 = temp_dir("untied");
  rewrite_model(d, d2, [](std::vector<OwnedTensor>&) {}, [](json& c) { c["text_config"]["tie_word_embeddings"] = false; });
  try {
    load_model(d2);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'language_model.lm_head.weight'"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
  fs::remove_all(d2);
}

TEST(LoaderVariants, UnquantizedMatrixBecomesDense) {
  auto ref = load_model(kTiny);
  const QMatrix& b = ref->layers[1].gdn.in_proj_b;  // [4, 256]
  std::vector<float> f32(size_t(b.rows * b.cols));
  for (int64_t r = 0; r < b.rows; ++r) dequantize_row(b, r, f32.data() + r * b.cols);
  // The shared expert's down projection as BF16 (values rounded to bf16 on purpose).
  const QMatrix& sd = ref->layers[2].moe.shared_down;  // [256, 128]
  std::vector<uint16_t> bf(size_t(sd.rows * sd.cols));
  for (int64_t r = 0; r < sd.rows; ++r)
    for (int64_t c = 0; c < sd.cols; ++c) bf[size_t(r * sd.cols + c)] = f32_to_bf16(dequantize_at(sd, r, c) * 3.0f);
  const std::string d = temp_dir("dense");
  const std::string pb = "language_model.model.layers.1.linear_attn.in_proj_b";
  const std::string ps = "language_model.model.layers.2.mlp.shared_expert.down_proj";
  rewrite_model(kTiny, d, [&](std::vector<OwnedTensor>& all) {
    std::erase_if(all, [&](const OwnedTensor& o) { return o.name.rfind(pb + ".", 0) == 0 || o.name.rfind(ps + ".", 0) == 0; });
    all.push_back({pb + ".weight", "F32", {b.rows, b.cols}, std::string(reinterpret_cast<const char*>(f32.data()), f32.size() * 4)});
    all.push_back({ps + ".weight", "BF16", {sd.rows, sd.cols}, std::string(reinterpret_cast<const char*>(bf.data()), bf.size() * 2)});
  });
  auto w = load_model(d);
  const QMatrix& db = w->layers[1].gdn.in_proj_b;
  EXPECT_EQ(db.bits, 0);
  ASSERT_NE(db.dense, nullptr);
  for (size_t i = 0; i < f32.size(); ++i) ASSERT_EQ(db.dense[i], f32[i]) << i;
  EXPECT_EQ(dequantize_at(db, 3, 100), dequantize_at(b, 3, 100));
  const QMatrix& ds = w->layers[2].moe.shared_down;
  EXPECT_EQ(ds.bits, 0);
  EXPECT_EQ(ds.rows, 256);
  EXPECT_EQ(ds.cols, 128);
  EXPECT_EQ(ds.dense[5 * 128 + 7], bf16_to_f32(bf[5 * 128 + 7]));
  // An MLX copy of it keeps the dense matrices (F32 when bf16 would round, BF16 when exact).
  const std::string out = temp_dir("dense_out");
  WriteOptions o;
  o.progress = false;
  write_mlx_checkpoint(*w, out, o);
  TensorSet ts = TensorSet::open_dir(out);
  EXPECT_EQ(ts.get(ps + ".weight").dtype, DType::BF16);
  EXPECT_FALSE(ts.has(ps + ".scales"));
  auto back = load_model(out);
  expect_same(*w, *back);
  fs::remove_all(d);
  fs::remove_all(out);
}

TEST(LoaderVariants, UnalignedDataIsCopied) {
  auto ref = load_model(kTiny);
  const std::string d = temp_dir("unaligned");
  fs::copy_file(kTiny + "/config.json", d + "/config.json");
  std::string raw = read_text_file(kTiny + "/model.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(raw[size_t(i)]);
  std::string header = raw.substr(8, n) + " ";  // one more byte: every tensor's data is now odd-aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
  write_text_file(d + "/model.safetensors", out + header + raw.substr(8 + n));
  auto w = load_model(d);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->embed.qweight) % 4, 0u);
  expect_same(*ref, *w);
  fs::remove_all(d);
}

TEST(LoaderVariants, HfTextOnlyPrefixAndBf16) {
  auto ref = load_model(kTiny);
  const std::string hf = temp_dir("hf");
  WriteOptions o;
  o.progress = false;
  write_hf_checkpoint(*ref, hf, o);
  auto from_hf = load_model(hf);
  // "model.language_model.X" -> "model.X"; norms and conv1d stored as BF16 (exact: they came from bf16).
  const std::string d = temp_dir("hf_text");
  rewrite_model(hf, d, [](std::vector<OwnedTensor>& all) {
    for (auto& o : all) {
      if (o.name.rfind("model.language_model.", 0) == 0) o.name = "model." + o.name.substr(std::strlen("model.language_model."));
      const bool small = o.name.find("norm.weight") != std::string::npos || o.name.find("conv1d") != std::string::npos ||
                         o.name.find("dt_bias") != std::string::npos;
      if (small && o.dtype == "F32") {
        std::string bf(o.bytes.size() / 2, '\0');
        for (size_t i = 0; i < o.bytes.size() / 4; ++i) {
          float f;
          std::memcpy(&f, o.bytes.data() + 4 * i, 4);
          uint16_t h = f32_to_bf16(f);
          ASSERT_EQ(bf16_to_f32(h), f) << o.name;
          std::memcpy(bf.data() + 2 * i, &h, 2);
        }
        o.bytes = bf;
        o.dtype = "BF16";
      }
    }
    all.push_back({"model.visual.blocks.0.norm.weight", "F32", {1}, std::string(4, '\0')});
  });
  auto w = load_model(d);
  expect_same(*from_hf, *w);
  fs::remove_all(hf);
  fs::remove_all(d);
}

TEST(LoaderVariants, HfExpertsOneTensorEach) {
  auto ref = load_model(kTiny);
  const std::string hf = temp_dir("hf_pe_src");
  WriteOptions o;
  o.progress = false;
  write_hf_checkpoint(*ref, hf, o);
  auto from_hf = load_model(hf);
  const int64_t E = 16, I = 128, H = 256;
  const std::string d = temp_dir("hf_per_expert");
  rewrite_model(hf, d, [&](std::vector<OwnedTensor>& all) {
    std::vector<OwnedTensor> out;
    for (auto& t : all) {
      auto pos = t.name.find("mlp.experts.");
      if (pos == std::string::npos) {
        out.push_back(t);
        continue;
      }
      const std::string base = t.name.substr(0, pos) + "mlp.experts.";
      const bool gate_up = t.name.ends_with("gate_up_proj");
      const size_t per = gate_up ? size_t(2 * I * H * 4) : size_t(H * I * 4);
      for (int64_t e = 0; e < E; ++e) {
        const std::string eb = base + std::to_string(e) + ".";
        const std::string bytes = t.bytes.substr(size_t(e) * per, per);
        if (gate_up) {
          out.push_back({eb + "gate_proj.weight", "F32", {I, H}, bytes.substr(0, per / 2)});
          out.push_back({eb + "up_proj.weight", "F32", {I, H}, bytes.substr(per / 2)});
        } else {
          out.push_back({eb + "down_proj.weight", "F32", {H, I}, bytes});
        }
      }
    }
    all = out;
  });
  EXPECT_TRUE(TensorSet::open_dir(d).has("model.language_model.layers.2.mlp.experts.15.up_proj.weight"));
  auto w = load_model(d);
  expect_same(*from_hf, *w);
  // One expert missing: an error naming it.
  const std::string d2 = temp_dir("hf_per_expert_missing");
  rewrite_model(d, d2, [](std::vector<OwnedTensor>& all) {
    std::erase_if(all, [](const OwnedTensor& t) { return t.name == "model.language_model.layers.1.mlp.experts.7.down_proj.weight"; });
  });
  try {
    load_model(d2);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'model.language_model.layers.1.mlp.experts.7.down_proj.weight'"),
              std::string::npos) << e.what();
  }
  fs::remove_all(hf);
  fs::remove_all(d);
  fs::remove_all(d2);
}

}  // namespace
}  // namespace lilac
