#include "model/hf_writer.h"

#include <cstring>
#include <deque>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/progress.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "model/tensor_table.h"
#include "model/weight_walk.h"

namespace lilac {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

void make_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw Error("cannot create directory " + dir + ": " + ec.message());
}

// Holds the bytes of tensors made for writing.
struct Arena {
  std::deque<std::vector<float>> f32;
  std::deque<std::vector<uint16_t>> u16;
  std::vector<TensorToWrite> list;

  void add_f32(const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
    f32.push_back(std::move(v));
    list.push_back({name, DType::F32, std::move(shape), f32.back().data(), f32.back().size() * 4});
  }
  // BF16 when every value is exactly representable, else F32.
  void add_compact(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      h[i] = f32_to_bf16(v[i]);
      if (bf16_to_f32(h[i]) != v[i] && !(v[i] != v[i])) {
        add_f32(name, std::move(shape), v);
        return;
      }
    }
    u16.push_back(std::move(h));
    list.push_back({name, DType::BF16, std::move(shape), u16.back().data(), u16.back().size() * 2});
  }
  void add_raw(const std::string& name, DType dt, std::vector<int64_t> shape, const void* p, size_t nbytes) {
    list.push_back({name, dt, std::move(shape), p, nbytes});
  }
};

std::vector<float> dequantize_all(const QMatrix& m, int n = 1, const QExperts* e = nullptr) {
  std::vector<float> out(static_cast<size_t>(int64_t(n) * m.rows * m.cols));
  for (int k = 0; k < n; ++k) {
    QMatrix mk = e ? e->expert(k) : m;
    for (int64_t r = 0; r < m.rows; ++r) dequantize_row(mk, r, out.data() + (int64_t(k) * m.rows + r) * m.cols);
  }
  return out;
}

json source_config(const ModelWeights& w) {
  std::string p = path_join(w.dir, "config.json");
  json j;
  if (!w.dir.empty() && file_exists(p)) {
    try {
      j = json::parse(read_text_file(p));
    } catch (const json::exception& e) {
      throw Error(p + ": invalid JSON: " + e.what());
    }
  } else {
    j = json::parse(config_to_json(w.config));
  }
  j.erase("quantization");
  j.erase("quantization_config");
  return j;
}

void copy_if_present(const std::string& from_dir, const std::string& to_dir, const std::string& name) {
  std::string src = path_join(from_dir, name);
  if (from_dir.empty() || !file_exists(src)) return;
  std::error_code ec;
  fs::copy_file(src, path_join(to_dir, name), fs::copy_options::overwrite_existing, ec);
  if (ec) throw Error("cannot copy " + src + " to " + to_dir + ": " + ec.message());
}

void write_all(const std::string& out_dir, const Arena& a, const WriteOptions& opts, const std::string& label,
               const char* format) {
  uint64_t total = 0;
  for (auto& t : a.list) total += t.nbytes;
  Progress progress(label, total, opts.progress);
  write_safetensors_sharded(
      out_dir, a.list, opts.shard_bytes, {{"format", format}},
      [](void* ctx, uint64_t n) { static_cast<Progress*>(ctx)->add(n); }, &progress);
  progress.finish();
}

}  // namespace

std::string config_to_json(const ModelConfig& c) {
  json t;
  t["model_type"] = "qwen3_5_moe_text";
  t["vocab_size"] = c.vocab_size;
  t["hidden_size"] = c.hidden_size;
  t["num_hidden_layers"] = c.num_layers;
  t["num_attention_heads"] = c.num_heads;
  t["num_key_value_heads"] = c.num_kv_heads;
  t["head_dim"] = c.head_dim;
  t["attn_output_gate"] = c.attn_output_gate;
  t["max_position_embeddings"] = c.max_position_embeddings;
  t["linear_num_key_heads"] = c.linear_num_key_heads;
  t["linear_num_value_heads"] = c.linear_num_value_heads;
  t["linear_key_head_dim"] = c.linear_key_head_dim;
  t["linear_value_head_dim"] = c.linear_value_head_dim;
  t["linear_conv_kernel_dim"] = c.linear_conv_kernel_dim;
  t["num_experts"] = c.num_experts;
  t["num_experts_per_tok"] = c.num_experts_per_tok;
  t["moe_intermediate_size"] = c.moe_intermediate_size;
  t["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  t["norm_topk_prob"] = c.norm_topk_prob;
  t["rms_norm_eps"] = c.rms_norm_eps;
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  t["hidden_act"] = "silu";
  t["attention_bias"] = false;
  t["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope_theta},
                          {"partial_rotary_factor", c.partial_rotary_factor}};
  json lt = json::array();
  for (bool f : c.full_attention) lt.push_back(f ? "full_attention" : "linear_attention");
  t["layer_types"] = lt;
  if (c.mtp_num_hidden_layers >= 0) t["mtp_num_hidden_layers"] = c.mtp_num_hidden_layers;
  if (!c.eos_token_ids.empty()) t["eos_token_id"] = c.eos_token_ids;
  return t.dump(2) + "\n";
}

void write_hf_checkpoint(const ModelWeights& w, const std::string& out_dir) {
  write_hf_checkpoint(w, out_dir, WriteOptions{});
}

void write_hf_checkpoint(const ModelWeights& w, const std::string& out_dir, const WriteOptions& opts) {
  make_dir(out_dir);
  Arena a;
  const LayoutNames names = hf_names();
  std::vector<float>* gate_up = nullptr;  // the layer's fused experts buffer (gate, then up, fill it)
  walk_weights(w, [&](const WeightRef& r) {
    const TensorSpec& t = *r.spec;
    const std::string name = names.name(t);
    switch (r.kind) {
      case WeightKind::Matrix:
        a.add_f32(name + ".weight", {r.matrix->rows, r.matrix->cols}, dequantize_all(*r.matrix));
        break;
      case WeightKind::Experts: {
        const QExperts& e = *r.experts;
        const QMatrix& m = e.first;
        if (t.role == TensorRole::ExpertsDown) {
          a.add_f32(name, {e.n, m.rows, m.cols}, dequantize_all(m, e.n, &e));
          break;
        }
        // Fused [E, 2I, H]: rows 0..I-1 gate, I..2I-1 up.
        if (t.role == TensorRole::ExpertsGate) {
          a.add_f32(name, {e.n, 2 * m.rows, m.cols}, std::vector<float>(size_t(int64_t(e.n) * 2 * m.rows * m.cols)));
          gate_up = &a.f32.back();
        }
        if (!gate_up) throw Error("write_hf_checkpoint: '" + t.name + "' comes before its layer's experts.gate");
        const int64_t half = t.role == TensorRole::ExpertsUp ? 1 : 0;
        std::vector<float> v = dequantize_all(m, e.n, &e);
        for (int k = 0; k < e.n; ++k)
          std::memcpy(gate_up->data() + (int64_t(k) * 2 + half) * m.rows * m.cols, v.data() + int64_t(k) * m.rows * m.cols,
                      size_t(m.rows * m.cols) * 4);
        if (t.role == TensorRole::ExpertsUp) gate_up = nullptr;
        break;
      }
      case WeightKind::NormCentred: {
        std::vector<float> v = *r.values;
        for (float& x : v) x -= 1.0f;
        const int64_t n = int64_t(v.size());  // (read before v is moved)
        a.add_f32(name, {n}, std::move(v));
        break;
      }
      case WeightKind::Vector:
        a.add_f32(name, {int64_t(r.values->size())}, *r.values);
        break;
      case WeightKind::Conv1d:
        a.add_f32(name, names.stored_shape(t), *r.values);
        break;
    }
  });
  write_all(out_dir, a, opts, "writing " + out_dir, "pt");
  write_text_file(path_join(out_dir, "config.json"), source_config(w).dump(2) + "\n");
  copy_if_present(w.dir, out_dir, "generation_config.json");
}

json write_mlx_tensors(const ModelWeights& w, const std::string& out_dir, const WriteOptions& opts) {
  make_dir(out_dir);
  Arena a;
  json q = {{"group_size", 64}, {"bits", 4}, {"mode", "affine"}};
  auto put_matrix = [&](const std::string& base, const QMatrix& m, int n) {
    std::vector<int64_t> lead;
    if (n) lead.push_back(n);
    auto with = [&](int64_t x, int64_t y) {
      std::vector<int64_t> s = lead;
      s.push_back(x);
      s.push_back(y);
      return s;
    };
    const int64_t cnt = n ? n : 1;
    if (!m.bits) {
      std::vector<float> v(m.dense, m.dense + cnt * m.rows * m.cols);
      a.add_compact(base + ".weight", with(m.rows, m.cols), v);
      return;
    }
    a.add_raw(base + ".weight", DType::U32, with(m.rows, m.words_per_row()), m.qweight,
              size_t(cnt * m.rows * m.words_per_row()) * 4);
    a.add_raw(base + ".scales", DType::BF16, with(m.rows, m.groups_per_row()), m.scales,
              size_t(cnt * m.rows * m.groups_per_row()) * 2);
    a.add_raw(base + ".biases", DType::BF16, with(m.rows, m.groups_per_row()), m.biases,
              size_t(cnt * m.rows * m.groups_per_row()) * 2);
    if (m.bits != 4 || m.group_size != 64) q[base] = {{"group_size", m.group_size}, {"bits", m.bits}};
  };
  const LayoutNames names = mlx_names();
  walk_weights(w, [&](const WeightRef& r) {
    const TensorSpec& t = *r.spec;
    switch (r.kind) {
      case WeightKind::Matrix: put_matrix(names.name(t), *r.matrix, 0); break;
      case WeightKind::Experts: put_matrix(names.name(t), r.experts->first, r.experts->n); break;
      case WeightKind::NormCentred:
      case WeightKind::Vector: a.add_compact(names.name(t), {int64_t(r.values->size())}, *r.values); break;
      case WeightKind::Conv1d: a.add_compact(names.name(t), names.stored_shape(t), *r.values); break;
    }
  });
  write_all(out_dir, a, opts, "writing " + out_dir, "mlx");
  return q;
}

void write_mlx_checkpoint(const ModelWeights& w, const std::string& out_dir, const WriteOptions& opts) {
  json q = write_mlx_tensors(w, out_dir, opts);
  json cfg = source_config(w);
  cfg["quantization"] = q;
  cfg["quantization_config"] = q;
  write_text_file(path_join(out_dir, "config.json"), cfg.dump(2) + "\n");
}

void convert_checkpoint(const std::string& model_dir, const std::string& out_dir, const WriteOptions& opts) {
  std::error_code ec;
  if (fs::exists(out_dir, ec) && fs::equivalent(model_dir, out_dir, ec))
    throw InputError("convert: --out " + out_dir + " is the model folder itself; choose another folder");
  LoadOptions lo;
  lo.progress = opts.progress;
  auto w = load_model(model_dir, lo);
  write_mlx_checkpoint(*w, out_dir, opts);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"})
    copy_if_present(model_dir, out_dir, f);
}

}  // namespace lilac
