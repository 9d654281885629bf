// The MTP head's tensors (../shared/MODEL_MTP.md §3, §8): loaded from the MLX layout of tiny-mtp, from an
// HF copy with stacked or per-expert experts (quantized on load, bit for bit the fixture's), kept by
// convert; a checkpoint without them loads without a head and says why; a partial or misshapen head is
// an error naming the tensor; mtp_num_hidden_layers 0 leaves the tensors unused.
#include <gtest/gtest.h>


#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "model/hf_writer.h"
#include "model/safetensors.h"
#include "model/tensor_table.h"
#include "model/weight_walk.h"
#include "model/weights.h"
#include "support/model_files.h"

namespace lilac {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const std::string kMtp = std::string(LILAC_SHARED_DIR) + "/fixtures/tiny-mtp/mlx4";
const LoadOptions kQuiet{.progress = false};

std::string temp_dir(const std::string& tag) { return testutil::temp_dir("lilac_mtp_", tag); }
using testutil::OwnedTensor;

// A fresh copy of `src` with `edit` applied to its tensors and `edit_config` to its config (testutil::rewrite_model).
std::string rewrite(const std::string& src, const std::string& tag,
                    const std::function<void(std::vector<OwnedTensor>&)>& edit,
                    const std::function<void(json&)>& edit_config = nullptr) {
  const std::string dst = temp_dir(tag);
  testutil::rewrite_model(src, dst, edit, edit_config);
  return dst;
}

// Every MTP tensor of a equals b's (quantized words / scales / biases bit for bit, vectors exactly).
int expect_same_mtp(const ModelWeights& a, const ModelWeights& b) {
  std::vector<WeightRef> ra, rb;
  auto keep = [](std::vector<WeightRef>& v) { return [&v](const WeightRef& r) { if (is_mtp_name(r.name)) v.push_back(r); }; };
  walk_weights(a, keep(ra));
  walk_weights(b, keep(rb));
  EXPECT_EQ(ra.size(), rb.size());
  int n = 0;
  for (size_t i = 0; i < std::min(ra.size(), rb.size()); ++i, ++n) {
    EXPECT_EQ(ra[i].name, rb[i].name);
    if (ra[i].values) {
      EXPECT_EQ(*ra[i].values, *rb[i].values) << ra[i].name;
      continue;
    }
    const QMatrix& x = ra[i].matrix ? *ra[i].matrix : ra[i].experts->first;
    const QMatrix& y = rb[i].matrix ? *rb[i].matrix : rb[i].experts->first;
    const int64_t cnt = ra[i].experts ? ra[i].experts->n : 1;
    EXPECT_EQ(x.bits, y.bits) << ra[i].name;
    EXPECT_EQ(x.rows, y.rows) << ra[i].name;
    EXPECT_EQ(x.cols, y.cols) << ra[i].name;
    if (x.bits != y.bits || x.rows != y.rows || x.cols != y.cols || !x.bits) continue;
    EXPECT_EQ(0, std::memcmp(x.qweight, y.qweight, size_t(cnt * x.rows * x.words_per_row()) * 4)) << ra[i].name;
    EXPECT_EQ(0, std::memcmp(x.scales, y.scales, size_t(cnt * x.rows * x.groups_per_row()) * 2)) << ra[i].name;
    EXPECT_EQ(0, std::memcmp(x.biases, y.biases, size_t(cnt * x.rows * x.groups_per_row()) * 2)) << ra[i].name;
  }
  return n;
}

void expect_error(const std::string& dir, const std::vector<std::string>& parts) {
  try {
    load_model(dir, kQuiet);
    ADD_FAILURE() << "no error for " << dir;
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// The table's MTP block: 20 entries after the backbone, named as the checkpoints name them in both layouts.
TEST(LoaderMtp, TableBlock) {
  const ModelConfig c = load_config(kMtp);
  TableOptions o;
  const size_t backbone = tensor_table(c, o).size();
  o.mtp_layers = 1;
  const auto t = tensor_table(c, o);
  ASSERT_EQ(t.size(), backbone + 20);
  std::map<std::string, TensorSpec> mtp;
  for (size_t i = backbone; i < t.size(); ++i) {
    EXPECT_EQ(t[i].block, TensorBlock::Mtp) << t[i].name;
    EXPECT_TRUE(is_mtp_name(t[i].name)) << t[i].name;
    mtp[t[i].name] = t[i];
  }
  const TensorSpec& fc = mtp.at("mtp.fc");
  EXPECT_EQ(fc.role, TensorRole::MtpFc);
  EXPECT_EQ(fc.shape(), (std::vector<int64_t>{c.hidden_size, 2 * c.hidden_size}));
  EXPECT_EQ(mtp.at("mtp.layers.0.mlp.gate").bits, 8);
  EXPECT_EQ(mtp.at("mtp.layers.0.self_attn.q_proj").layer, 0);
  const TensorSpec& up = mtp.at("mtp.layers.0.mlp.experts.up");
  EXPECT_EQ(mlx_names().name(up), "mtp.layers.0.mlp.switch_mlp.up_proj");
  EXPECT_EQ(hf_names().name(up), "mtp.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(hf_names().expert_name(up, 3), "mtp.layers.0.mlp.experts.3.up_proj.weight");
  EXPECT_EQ(mlx_names().name(mtp.at("mtp.norm.weight")), "mtp.norm.weight");
  EXPECT_EQ(hf_names().name(fc), "mtp.fc");
}

TEST(LoaderMtp, MlxFixtureHasTheHead) {
  auto w = load_model(kMtp, kQuiet);
  ASSERT_TRUE(w->has_mtp());
  EXPECT_EQ(w->config.mtp_num_hidden_layers, 1);
  const int64_t H = w->config.hidden_size;
  const MtpWeights& m = w->mtp;
  EXPECT_EQ(m.fc.rows, H);
  EXPECT_EQ(m.fc.cols, 2 * H);
  EXPECT_EQ(m.fc.bits, 4);
  ASSERT_EQ(m.layers.size(), 1u);
  const LayerWeights& L = m.layers[0];
  EXPECT_TRUE(L.full_attention);
  EXPECT_EQ(L.attn.q_proj.rows, w->config.q_proj_rows());
  EXPECT_EQ(L.moe.router.bits, 8);  // the config's override for mtp.layers.0.mlp.gate
  EXPECT_EQ(L.moe.shared_expert_gate.bits, 8);
  EXPECT_EQ(L.moe.gate.n, w->config.num_experts);
  // Norms carry the +1 baked in (MLX layout): stored values are the multipliers, around 1.
  for (const auto* v : {&m.pre_fc_norm_embedding, &m.pre_fc_norm_hidden, &m.norm, &L.input_norm}) {
    ASSERT_EQ(int64_t(v->size()), H);
    for (float x : *v) EXPECT_TRUE(x >= 0.5f && x <= 1.9f) << x;
  }
  EXPECT_TRUE(w->no_mtp_reason.empty());
  // The other fixtures have none (config says 0, no tensors).
  auto t = load_model(std::string(LILAC_SHARED_DIR) + "/fixtures/tiny/mlx4", kQuiet);
  EXPECT_FALSE(t->has_mtp());
  EXPECT_NE(t->no_mtp_reason.find("no mtp.* tensors"), std::string::npos) << t->no_mtp_reason;
}

// HF copy (stacked experts, norms without +1, dequantized F32) loads back to the same quantized head;
// per-expert tensors too; convert writes the fixture's bytes back.
TEST(LoaderMtp, HfStackedAndPerExpertAndConvert) {
  auto mlx = load_model(kMtp, kQuiet);
  const std::string hf = temp_dir("hf");
  WriteOptions o;
  o.progress = false;
  write_hf_checkpoint(*mlx, hf, o);
  TensorSet ts = TensorSet::open_dir(hf);
  const int64_t E = mlx->config.num_experts, I = mlx->config.moe_intermediate_size, H = mlx->config.hidden_size;
  ASSERT_TRUE(ts.has("mtp.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_EQ(ts.get("mtp.layers.0.mlp.experts.gate_up_proj").shape, (std::vector<int64_t>{E, 2 * I, H}));
  EXPECT_EQ(ts.get("mtp.fc.weight").shape, (std::vector<int64_t>{H, 2 * H}));
  EXPECT_EQ(tensor_float_at(ts.get("mtp.norm.weight"), 3) + 1.0f, mlx->mtp.norm[3]);  // zero-centred in HF
  auto from_hf = load_model(hf, kQuiet);
  ASSERT_TRUE(from_hf->has_mtp());
  EXPECT_EQ(expect_same_mtp(*mlx, *from_hf), 7 + 10 + 3);  // norms, matrices, expert stacks

  // Per-expert names (FP8-style releases): mtp.layers.0.mlp.experts.{e}.{gate,up,down}_proj.weight.
  const std::string pe = rewrite(hf, "per_expert", [&](std::vector<OwnedTensor>& all) {
    std::vector<OwnedTensor> out;
    for (auto& t : all) {
      if (t.name != "mtp.layers.0.mlp.experts.gate_up_proj" && t.name != "mtp.layers.0.mlp.experts.down_proj") {
        out.push_back(t);
        continue;
      }
      const bool gate_up = t.name.ends_with("gate_up_proj");
      const size_t per = gate_up ? size_t(2 * I * H * 4) : size_t(H * I * 4);
      for (int64_t e = 0; e < E; ++e) {
        const std::string eb = "mtp.layers.0.mlp.experts." + std::to_string(e) + ".";
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
  auto w = load_model(pe, kQuiet);
  expect_same_mtp(*mlx, *w);

  // convert keeps the head: the MLX files hold the fixture's bytes for every mtp.* tensor.
  const std::string out = temp_dir("convert");
  convert_checkpoint(hf, out, o);
  TensorSet a = TensorSet::open_dir(kMtp), b = TensorSet::open_dir(out);
  int compared = 0;
  for (auto& [name, t] : a.tensors()) {
    if (!is_mtp_name(name)) continue;
    const TensorInfo* u = b.find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_EQ(t.shape, u->shape) << name;
    ASSERT_EQ(t.nbytes, u->nbytes) << name;
    EXPECT_EQ(0, std::memcmp(t.data, u->data, t.nbytes)) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 46);
  auto back = load_model(out, kQuiet);
  EXPECT_EQ(back->config.mtp_num_hidden_layers, 1);
  EXPECT_EQ(quant_spec_for(back->config, "mtp.layers.0.mlp.gate").bits, 8);
  for (const auto& d : {hf, pe, out}) fs::remove_all(d);
}

TEST(LoaderMtp, WithoutTensorsLoadsWithoutAHeadAndSaysWhy) {
  // mlx-community conversions: config says 1, no mtp.* tensors.
  const std::string d = rewrite(kMtp, "dropped", [](std::vector<OwnedTensor>& all) {
    std::erase_if(all, [](const OwnedTensor& t) { return is_mtp_name(t.name); });
  });
  auto w = load_model(d, kQuiet);
  EXPECT_FALSE(w->has_mtp());
  EXPECT_NE(w->no_mtp_reason.find("mtp_num_hidden_layers 1 but the checkpoint has no mtp.* tensors"), std::string::npos)
      << w->no_mtp_reason;
  fs::remove_all(d);
}

TEST(LoaderMtp, ConfigZeroLeavesTheTensorsUnused) {
  const std::string d = rewrite(kMtp, "zero", [](std::vector<OwnedTensor>&) {}, [](json& c) {
    c["text_config"]["mtp_num_hidden_layers"] = 0;
  });
  auto w = load_model(d, kQuiet);
  EXPECT_FALSE(w->has_mtp());
  EXPECT_NE(w->no_mtp_reason.find("mtp_num_hidden_layers 0"), std::string::npos);
  fs::remove_all(d);
}

TEST(LoaderMtp, PartialOrMisshapenHeadIsAnErrorNamingTheTensor) {
  const std::string partial = rewrite(kMtp, "partial", [](std::vector<OwnedTensor>& all) {
    std::erase_if(all, [](const OwnedTensor& t) { return t.name.rfind("mtp.layers.0.self_attn.k_proj.", 0) == 0; });
  });
  expect_error(partial, {"missing tensor 'mtp.layers.0.self_attn.k_proj.weight'", "MTP head"});
  // Only one tensor of a head (a config without mtp_num_hidden_layers: the count comes from the tensors).
  const std::string lone = rewrite(
      kMtp, "lone",
      [](std::vector<OwnedTensor>& all) {
        std::erase_if(all, [](const OwnedTensor& t) { return is_mtp_name(t.name) && t.name != "mtp.norm.weight"; });
      },
      [](json& c) { c["text_config"].erase("mtp_num_hidden_layers"); });
  expect_error(lone, {"missing tensor 'mtp.pre_fc_norm_embedding.weight'", "1 mtp.* tensors"});
  const std::string shape = rewrite(kMtp, "shape", [](std::vector<OwnedTensor>& all) {
    for (auto& t : all)
      if (t.name == "mtp.norm.weight") {
        t.shape = {64};
        t.bytes.resize(128);
      }
  });
  expect_error(shape, {"tensor 'mtp.norm.weight'", "has shape [64], expected [128]"});
  const std::string extra = rewrite(kMtp, "extra", [](std::vector<OwnedTensor>& all) {
    all.push_back({"mtp.layers.0.self_attn.extra.weight", "BF16", {2}, std::string(4, '\0')});
  });
  expect_error(extra, {"unused tensor 'mtp.layers.0.self_attn.extra.weight'"});
  const std::string two = rewrite(kMtp, "two", [](std::vector<OwnedTensor>&) {}, [](json& c) {
    c["text_config"]["mtp_num_hidden_layers"] = 2;
  });
  expect_error(two, {"2 layers", "exactly one"});
  for (const auto& d : {partial, lone, shape, extra, two}) fs::remove_all(d);
}

}  // namespace
}  // namespace lilac
