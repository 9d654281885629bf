// load_model: MLX 4-bit layout (zero-copy views into the mmaps) or the original Hugging Face layout
// (quantized on load to the same format). Every tensor is checked by name, dtype and shape.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/progress.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace lilac {

namespace {

enum class Layout { MLX, HF };

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

bool skipped_name(const std::string& n) {
  for (const char* p : {"vision_tower.", "model.visual.", "language_model.mtp.", "model.mtp."})
    if (n.rfind(p, 0) == 0) return true;
  return false;
}

const std::string kMtp = "mtp.";  // the MTP head's tensors (MODEL_MTP.md §3), in both layouts

struct Builder {
  const TensorSet& ts;
  ModelWeights& w;
  const ModelConfig& c;
  Layout layout = Layout::MLX;
  std::string mp;    // model prefix, e.g. "language_model.model."
  std::string head;  // lm_head base name, e.g. "language_model.lm_head"
  std::set<std::string> used;
  Progress* progress = nullptr;

  Builder(const TensorSet& t, ModelWeights& mw) : ts(t), w(mw), c(mw.config) {}

  std::string where(const TensorInfo& t) const { return t.file + ": tensor '" + t.name + "'"; }

  const TensorInfo& need(const std::string& name) {
    const TensorInfo* t = ts.find(name);
    if (!t) throw Error("missing tensor '" + name + "' in " + ts.origin());
    used.insert(name);
    return *t;
  }

  void expect_shape(const TensorInfo& t, const std::vector<int64_t>& shape) const {
    if (t.shape != shape)
      throw Error(where(t) + " has shape " + t.shape_str() + ", expected " + shape_str(shape) +
                  " (from config.json)");
  }
  void expect_float(const TensorInfo& t) const {
    if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16)
      throw Error(where(t) + " has dtype " + dtype_name(t.dtype) + ", expected F32, BF16 or F16");
  }
  void expect_dtype(const TensorInfo& t, DType d) const {
    if (t.dtype != d) throw Error(where(t) + " has dtype " + dtype_name(t.dtype) + ", expected " + dtype_name(d));
  }
  void done(const TensorInfo& t) {
    if (progress) progress->add(t.nbytes);
  }

  // A typed pointer into the mapping; copied into owned memory when the file leaves it unaligned.
  template <class T>
  const T* view(const TensorInfo& t) {
    if (reinterpret_cast<uintptr_t>(t.data) % alignof(T) == 0) return reinterpret_cast<const T*>(t.data);
    auto buf = std::make_shared<std::vector<T>>(t.nbytes / sizeof(T));
    std::memcpy(buf->data(), t.data, t.nbytes);
    w.storage.push_back(buf);
    return buf->data();
  }

  // A vector of n floats; `add_one` for zero-centred norms stored without the +1 (HF layout).
  std::vector<float> vec(const std::string& name, const std::vector<int64_t>& shape, bool add_one = false) {
    const TensorInfo& t = need(name);
    expect_float(t);
    expect_shape(t, shape);
    std::vector<float> v = tensor_to_floats(t);
    if (add_one)
      for (float& x : v) x += 1.0f;
    done(t);
    return v;
  }

  // Reads row r of matrix e (cols floats) into out.
  using RowReader = std::function<void(int64_t e, int64_t r, float* out)>;
  static RowReader rows_of(const TensorInfo& t, const std::function<int64_t(int64_t, int64_t)>& src_offset,
                           int64_t cols) {
    return [&t, src_offset, cols](int64_t e, int64_t r, float* out) { tensor_floats(t, src_offset(e, r), cols, out); };
  }

  // Dense fp32 copy of `n` matrices [rows, cols].
  QMatrix dense_copy(int64_t n, int64_t rows, int64_t cols, const RowReader& read) {
    auto buf = std::make_shared<QBuffer>();
    buf->dense.resize(size_t(n * rows * cols));
    for (int64_t e = 0; e < n; ++e)
      for (int64_t r = 0; r < rows; ++r) read(e, r, buf->dense.data() + (e * rows + r) * cols);
    w.storage.push_back(buf);
    QMatrix m;
    m.rows = rows;
    m.cols = cols;
    m.bits = 0;
    m.dense = buf->dense.data();
    return m;
  }

  // ---- MLX layout ----
  // `n` == 0: a plain matrix [rows, cols]; else a stack [n, rows, cols] (switch_mlp experts).
  QMatrix mlx_matrix(const std::string& base, int64_t n, int64_t rows, int64_t cols) {
    std::vector<int64_t> lead;
    if (n) lead.push_back(n);
    auto with = [&](std::vector<int64_t> tail) {
      std::vector<int64_t> s = lead;
      s.insert(s.end(), tail.begin(), tail.end());
      return s;
    };
    const TensorInfo& wt = need(base + ".weight");
    const int64_t count = n ? n : 1;
    if (!ts.has(base + ".scales")) {
      if (ts.has(base + ".biases")) throw Error(where(ts.get(base + ".biases")) + " has no matching '" + base + ".scales'");
      expect_float(wt);
      expect_shape(wt, with({rows, cols}));
      QMatrix m = dense_copy(count, rows, cols, rows_of(wt, [&](int64_t e, int64_t r) { return (e * rows + r) * cols; }, cols));
      done(wt);
      return m;
    }
    QuantSpec q = quant_spec_for(c, base);
    if (!c.quantized)
      throw Error(where(wt) + " is quantized (has .scales) but config.json has no 'quantization' block");
    if (cols % q.group_size != 0 || (cols * q.bits) % 32 != 0)
      throw Error(where(wt) + ": " + std::to_string(cols) + " columns do not split into groups of " +
                  std::to_string(q.group_size) + " at " + std::to_string(q.bits) + " bits");
    const TensorInfo& st = need(base + ".scales");
    const TensorInfo& bt = need(base + ".biases");
    expect_dtype(wt, DType::U32);
    if (wt.shape != with({rows, cols * q.bits / 32}))
      throw Error(where(wt) + " has shape " + wt.shape_str() + ", expected " +
                  shape_str(with({rows, cols * q.bits / 32})) + " (" + std::to_string(rows) + " x " +
                  std::to_string(cols) + " at " + std::to_string(q.bits) + " bits, from config.json)");
    for (const TensorInfo* t : {&st, &bt}) {
      expect_dtype(*t, DType::BF16);
      expect_shape(*t, with({rows, cols / q.group_size}));
    }
    QMatrix m;
    m.rows = rows;
    m.cols = cols;
    m.bits = q.bits;
    m.group_size = q.group_size;
    m.qweight = view<uint32_t>(wt);
    m.scales = view<uint16_t>(st);
    m.biases = view<uint16_t>(bt);
    done(wt);
    done(st);
    done(bt);
    return m;
  }

  // ---- HF layout ----
  // Quantize `n` matrices [rows, cols] to `bits` (groups of 64); matrices whose width is not a
  // multiple of 64 stay dense.
  QMatrix hf_quantize(int64_t n, int64_t rows, int64_t cols, int bits, const RowReader& read) {
    const int group = 64;
    if (cols % group != 0) return dense_copy(n, rows, cols, read);
    auto buf = std::make_shared<QBuffer>();
    QMatrix m = quantize_rows(n * rows, cols, bits, group, *buf,
                              [&](int64_t rr, float* out) { read(rr / rows, rr % rows, out); });
    m.rows = rows;
    w.storage.push_back(buf);
    return m;
  }

  QMatrix hf_matrix(const std::string& base, int64_t rows, int64_t cols, int bits) {
    const TensorInfo& t = need(base + ".weight");
    expect_float(t);
    expect_shape(t, {rows, cols});
    QMatrix m = hf_quantize(1, rows, cols, bits, rows_of(t, [cols](int64_t, int64_t r) { return r * cols; }, cols));
    done(t);
    return m;
  }

  // ---- both ----
  QMatrix matrix(const std::string& base, int64_t rows, int64_t cols, int hf_bits = 4) {
    return layout == Layout::MLX ? mlx_matrix(base, 0, rows, cols) : hf_matrix(base, rows, cols, hf_bits);
  }

  // One decoder layer whose tensors are named `p` + "input_layernorm.weight", ... (p ends in '.').
  void load_layer(const std::string& p, bool full_attention, LayerWeights& L) {
    const bool hf = layout == Layout::HF;
    const int64_t H = c.hidden_size;
    L.full_attention = full_attention;
    L.input_norm = vec(p + "input_layernorm.weight", {H}, hf);
    L.post_norm = vec(p + "post_attention_layernorm.weight", {H}, hf);
    if (L.full_attention) {
      auto& a = L.attn;
      const std::string q = p + "self_attn.";
      a.q_proj = matrix(q + "q_proj", c.q_proj_rows(), H);
      a.k_proj = matrix(q + "k_proj", c.kv_dim(), H);
      a.v_proj = matrix(q + "v_proj", c.kv_dim(), H);
      a.o_proj = matrix(q + "o_proj", H, int64_t(c.num_heads) * c.head_dim);
      a.q_norm = vec(q + "q_norm.weight", {c.head_dim}, hf);
      a.k_norm = vec(q + "k_norm.weight", {c.head_dim}, hf);
    } else {
      auto& g = L.gdn;
      const std::string q = p + "linear_attn.";
      const int64_t Hv = c.linear_num_value_heads, K = c.linear_conv_kernel_dim, C = c.gdn_conv_dim();
      g.in_proj_qkv = matrix(q + "in_proj_qkv", C, H);
      g.in_proj_z = matrix(q + "in_proj_z", c.gdn_value_dim(), H);
      g.in_proj_b = matrix(q + "in_proj_b", Hv, H);
      g.in_proj_a = matrix(q + "in_proj_a", Hv, H);
      g.out_proj = matrix(q + "out_proj", H, c.gdn_value_dim());
      // [C, K, 1] (MLX) or [C, 1, K] (HF): the same memory order as [C, K].
      g.conv1d = vec(q + "conv1d.weight", hf ? std::vector<int64_t>{C, 1, K} : std::vector<int64_t>{C, K, 1});
      g.dt_bias = vec(q + "dt_bias", {Hv});
      g.A_log = vec(q + "A_log", {Hv});
      g.norm = vec(q + "norm.weight", {c.linear_value_head_dim});
    }
    auto& m = L.moe;
    const std::string q = p + "mlp.";
    const int64_t E = c.num_experts, I = c.moe_intermediate_size, S = c.shared_expert_intermediate_size;
    m.router = matrix(q + "gate", E, H, 8);
    m.shared_expert_gate = matrix(q + "shared_expert_gate", 1, H, 8);
    m.shared_gate = matrix(q + "shared_expert.gate_proj", S, H);
    m.shared_up = matrix(q + "shared_expert.up_proj", S, H);
    m.shared_down = matrix(q + "shared_expert.down_proj", H, S);
    m.gate.n = m.up.n = m.down.n = int(E);
    if (!hf) {
      m.gate.first = mlx_matrix(q + "switch_mlp.gate_proj", E, I, H);
      m.up.first = mlx_matrix(q + "switch_mlp.up_proj", E, I, H);
      m.down.first = mlx_matrix(q + "switch_mlp.down_proj", E, H, I);
    } else if (ts.has(q + "experts.gate_up_proj") || !ts.has(q + "experts.0.gate_proj.weight")) {
      // Fused: gate_up_proj [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up), down_proj [E, H, I].
      const TensorInfo& gu = need(q + "experts.gate_up_proj");
      expect_float(gu);
      expect_shape(gu, {E, 2 * I, H});
      m.gate.first = hf_quantize(E, I, H, 4, rows_of(gu, [&](int64_t e, int64_t r) { return (e * 2 * I + r) * H; }, H));
      m.up.first = hf_quantize(E, I, H, 4, rows_of(gu, [&](int64_t e, int64_t r) { return (e * 2 * I + I + r) * H; }, H));
      done(gu);
      const TensorInfo& dn = need(q + "experts.down_proj");
      expect_float(dn);
      expect_shape(dn, {E, H, I});
      m.down.first = hf_quantize(E, H, I, 4, rows_of(dn, [&](int64_t e, int64_t r) { return (e * H + r) * I; }, I));
      done(dn);
    } else {
      // One tensor per expert: experts.{e}.{gate,up,down}_proj.weight.
      auto per_expert = [&](const std::string& proj, int64_t rows, int64_t cols) {
        std::vector<const TensorInfo*> ex;
        for (int64_t e = 0; e < E; ++e) {
          const TensorInfo& t = need(q + "experts." + std::to_string(e) + "." + proj + ".weight");
          expect_float(t);
          expect_shape(t, {rows, cols});
          ex.push_back(&t);
        }
        QMatrix r = hf_quantize(E, rows, cols, 4, [&](int64_t e, int64_t row, float* out) {
          tensor_floats(*ex[size_t(e)], row * cols, cols, out);
        });
        for (auto* t : ex) done(*t);
        return r;
      };
      m.gate.first = per_expert("gate_proj", I, H);
      m.up.first = per_expert("up_proj", I, H);
      m.down.first = per_expert("down_proj", H, I);
    }
  }

  // The MTP head (MODEL_MTP.md §3; MLX layout: §8's transforms). Returns false when the checkpoint's
  // mtp.* tensors are to be ignored (config.json says mtp_num_hidden_layers 0); sets no_mtp_reason.
  bool load_mtp() {
    int64_t count = 0, layers = 0;
    const std::string lp = kMtp + "layers.";
    for (auto& [name, t] : ts.tensors()) {
      if (name.rfind(kMtp, 0) != 0) continue;
      ++count;
      if (name.rfind(lp, 0) == 0) layers = std::max<int64_t>(layers, std::atoll(name.c_str() + lp.size()) + 1);
    }
    const int declared = c.mtp_num_hidden_layers;
    if (count == 0) {
      w.no_mtp_reason = declared > 0 ? "config.json says mtp_num_hidden_layers " + std::to_string(declared) +
                                           " but the checkpoint has no mtp.* tensors (MLX conversions drop them)"
                                     : "the checkpoint has no MTP head (no mtp.* tensors)";
      if (declared > 0) LILAC_LOG_INFO("%s: no MTP head: %s", ts.origin().c_str(), w.no_mtp_reason.c_str());
      return true;
    }
    if (declared == 0) {
      w.no_mtp_reason = "config.json says mtp_num_hidden_layers 0";
      LILAC_LOG_INFO("%s: ignoring its %lld mtp.* tensors (config.json: mtp_num_hidden_layers 0)", ts.origin().c_str(),
                     (long long)count);
      return false;
    }
    const int64_t n = declared > 0 ? declared : std::max<int64_t>(1, layers);
    if (n != 1)
      throw Error(ts.origin() + ": the MTP head has " + std::to_string(n) +
                  " layers (mtp_num_hidden_layers); lilac supports exactly one");
    const bool hf = layout == Layout::HF;
    const int64_t H = c.hidden_size;
    MtpWeights& m = w.mtp;
    try {
      m.pre_fc_norm_embedding = vec(kMtp + "pre_fc_norm_embedding.weight", {H}, hf);
      m.pre_fc_norm_hidden = vec(kMtp + "pre_fc_norm_hidden.weight", {H}, hf);
      m.fc = matrix(kMtp + "fc", H, 2 * H);
      m.layers.resize(1);
      load_layer(lp + "0.", true, m.layers[0]);
      m.norm = vec(kMtp + "norm.weight", {H}, hf);
    } catch (const Error& e) {
      m = MtpWeights{};
      throw Error(std::string(e.what()) + " (MTP head: the checkpoint has " + std::to_string(count) +
                  " mtp.* tensors, and a head needs all of them; see MODEL_MTP.md)");
    }
    return true;
  }

  void load_all() {
    const int64_t V = c.vocab_size, H = c.hidden_size;
    w.embed = matrix(mp + "embed_tokens", V, H);
    if (ts.has(head + ".weight") || !c.tie_word_embeddings) {
      w.lm_head = matrix(head, V, H);
    } else {
      w.lm_head = w.embed;
    }
    w.final_norm = vec(mp + "norm.weight", {H}, layout == Layout::HF);
    w.layers.resize(size_t(c.num_layers));
    for (int i = 0; i < c.num_layers; ++i)
      load_layer(mp + "layers." + std::to_string(i) + ".", c.full_attention[size_t(i)], w.layers[size_t(i)]);
    const bool ignore_mtp = !load_mtp();
    for (auto& [name, t] : ts.tensors()) {
      if (used.count(name) || skipped_name(name) || (ignore_mtp && name.rfind(kMtp, 0) == 0)) continue;
      throw Error(t.file + ": unused tensor '" + name + "' (not part of the " + c.model_type +
                  " text model as configured; wrong layer count or layout?)");
    }
  }
};

}  // namespace

std::shared_ptr<const ModelWeights> load_model(const std::string& dir, const LoadOptions& opts) {
  auto w = std::make_shared<ModelWeights>();
  w->dir = dir;
  w->config = load_config(dir);
  TensorSet ts = TensorSet::open_dir(dir);

  Builder b(ts, *w);
  bool mlx_names = false;
  for (auto& [name, t] : ts.tensors())
    if (name.find(".switch_mlp.") != std::string::npos ||
        (name.size() > 7 && name.compare(name.size() - 7, 7, ".scales") == 0)) {
      mlx_names = true;
      break;
    }
  b.layout = (mlx_names || w->config.quantized) ? Layout::MLX : Layout::HF;
  if (b.layout == Layout::MLX) {
    if (ts.has("language_model.model.embed_tokens.weight")) {
      b.mp = "language_model.model.";
      b.head = "language_model.lm_head";
    } else if (ts.has("model.embed_tokens.weight")) {
      b.mp = "model.";
      b.head = "lm_head";
    } else {
      throw Error("missing tensor 'language_model.model.embed_tokens.weight' (or 'model.embed_tokens.weight') in " + dir);
    }
  } else {
    if (ts.has("model.language_model.embed_tokens.weight")) b.mp = "model.language_model.";
    else if (ts.has("model.embed_tokens.weight")) b.mp = "model.";
    else
      throw Error("missing tensor 'model.language_model.embed_tokens.weight' (or 'model.embed_tokens.weight') in " + dir);
    b.head = "lm_head";
  }
  const uint64_t total = ts.total_bytes();
  if (b.layout == Layout::MLX) {
    // The weights are views into the mappings: keep them alive with the model.
    for (auto& f : ts.files()) w->storage.push_back(f);
    // On a terminal, read a large checkpoint into the page cache now, with progress (the backend
    // would fault the pages in anyway, silently).
    uint64_t file_bytes = 0;
    for (auto& f : ts.files()) file_bytes += f->size();
    Progress progress("loading " + dir, file_bytes, opts.progress);
    if (progress.active()) {
      for (auto& f : ts.files()) {
        f->prefetch(0, f->size());
        const size_t chunk = size_t(64) << 20;
        const int64_t nchunks = int64_t((f->size() + chunk - 1) / chunk);
        parallel_ranges(nchunks, 1, [&](int64_t c0, int64_t c1) {
          for (int64_t c = c0; c < c1; ++c) {
            const size_t begin = size_t(c) * chunk, end = std::min(f->size(), begin + chunk);
            volatile uint8_t sink = 0;
            for (size_t i = begin; i < end; i += 4096) sink = sink + f->data()[i];
            progress.add(end - begin);
          }
        }, 4);
      }
      progress.finish();
    }
    b.load_all();
  } else {
    Progress progress("quantizing " + dir, total, opts.progress);
    b.progress = &progress;
    b.load_all();
    progress.finish();
  }
  LILAC_LOG_DEBUG("loaded %s (%s layout, %zu tensors, %s)", dir.c_str(), b.layout == Layout::MLX ? "MLX" : "HF",
                  ts.tensors().size(), Progress::format_bytes(double(total)).c_str());
  return w;
}

}  // namespace lilac
