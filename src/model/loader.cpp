// load_model: MLX 4-bit layout (zero-copy views into the mmaps) or the original Hugging Face layout
// (quantized on load to the same format). Every tensor of the table (model/tensor_table.h) is checked by
// name, dtype and shape; a tensor the table does not name is an error. The table includes the MTP head
// (mtp.*) when the checkpoint has one.
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
#include "model/tensor_table.h"
#include "model/weight_walk.h"
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

struct Builder {
  const TensorSet& ts;
  ModelWeights& w;
  const ModelConfig& c;
  Layout layout = Layout::MLX;
  LayoutNames names;  // the tensors' names in this checkpoint
  std::set<std::string> used, counted;
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
  void done(const TensorInfo& t) {  // progress, once per tensor
    if (progress && counted.insert(t.name).second) progress->add(t.nbytes);
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

  // HF experts of one layer: fused (gate_up_proj [E, 2I, H] with the gate rows first, down_proj [E, H, I])
  // or one tensor per expert (experts.{e}.{gate,up,down}_proj.weight).
  QMatrix hf_experts(const TensorSpec& t) {
    const int64_t E = t.count, rows = t.rows, cols = t.cols;
    TensorSpec gate = t;  // the layer's form is decided on its gate
    gate.role = TensorRole::ExpertsGate;
    gate.name = t.name.substr(0, t.name.rfind('.')) + ".gate";
    if (ts.has(names.name(gate)) || !ts.has(names.expert_name(gate, 0))) {
      const TensorInfo& f = need(names.name(t));
      const std::vector<int64_t> shape = names.stored_shape(t);
      expect_float(f);
      expect_shape(f, shape);
      const int64_t per = shape[1];  // stored rows per expert (2I for gate_up)
      const int64_t row0 = t.role == TensorRole::ExpertsUp ? rows : 0;
      QMatrix m = hf_quantize(E, rows, cols, t.bits,
                              rows_of(f, [=](int64_t e, int64_t r) { return (e * per + row0 + r) * cols; }, cols));
      done(f);
      return m;
    }
    std::vector<const TensorInfo*> ex;
    for (int64_t e = 0; e < E; ++e) {
      const TensorInfo& x = need(names.expert_name(t, e));
      expect_float(x);
      expect_shape(x, {rows, cols});
      ex.push_back(&x);
    }
    QMatrix m = hf_quantize(E, rows, cols, t.bits, [&](int64_t e, int64_t row, float* out) {
      tensor_floats(*ex[size_t(e)], row * cols, cols, out);
    });
    for (auto* x : ex) done(*x);
    return m;
  }

  // One tensor of the table into its place in the weights.
  void load(const TensorSpec& t) {
    const WeightSlot s = weight_slot(w, t);
    const bool hf = layout == Layout::HF;
    const std::string name = names.name(t);
    switch (t.kind) {
      case WeightKind::Matrix:
        *s.matrix = hf ? hf_matrix(name, t.rows, t.cols, t.bits) : mlx_matrix(name, 0, t.rows, t.cols);
        break;
      case WeightKind::Experts:
        s.experts->n = int(t.count);
        s.experts->first = hf ? hf_experts(t) : mlx_matrix(name, t.count, t.rows, t.cols);
        break;
      case WeightKind::NormCentred:
      case WeightKind::Vector:
      case WeightKind::Conv1d:
        // Zero-centred norms: HF stores them without the +1 (MLX with it). Conv1d: [C, K, 1] (MLX) or
        // [C, 1, K] (HF), the same memory order as [C, K].
        *s.values = vec(name, names.stored_shape(t), hf && t.kind == WeightKind::NormCentred);
        break;
    }
  }

  // The MTP head's layers to load (MODEL_MTP.md §2, §8), from config.json's mtp_num_hidden_layers and the
  // checkpoint's mtp.* tensors: absent from the config, the mtp.layers.N present say; no tensors: no head
  // (w.no_mtp_reason says why; logged when the config declares one, as mlx-community conversions do);
  // -1: the config says 0, so the tensors are ignored; more than one: an error.
  int mtp_layers() {
    int64_t count = 0, layers = 0;
    const std::string lp = "mtp.layers.";
    for (auto& [name, t] : ts.tensors()) {
      if (!is_mtp_name(name)) continue;
      ++count;
      if (name.rfind(lp, 0) == 0) layers = std::max<int64_t>(layers, std::atoll(name.c_str() + lp.size()) + 1);
    }
    mtp_tensors = count;
    const int declared = c.mtp_num_hidden_layers;
    if (count == 0) {
      w.no_mtp_reason = declared > 0 ? "config.json says mtp_num_hidden_layers " + std::to_string(declared) +
                                           " but the checkpoint has no mtp.* tensors (MLX conversions drop them)"
                                     : "the checkpoint has no MTP head (no mtp.* tensors)";
      if (declared > 0) LILAC_LOG_INFO("%s: no MTP head: %s", ts.origin().c_str(), w.no_mtp_reason.c_str());
      return 0;
    }
    if (declared == 0) {
      w.no_mtp_reason = "config.json says mtp_num_hidden_layers 0";
      LILAC_LOG_INFO("%s: ignoring its %lld mtp.* tensors (config.json: mtp_num_hidden_layers 0)", ts.origin().c_str(),
                     (long long)count);
      return -1;
    }
    const int64_t n = declared > 0 ? declared : std::max<int64_t>(1, layers);
    if (n != 1)
      throw Error(ts.origin() + ": the MTP head has " + std::to_string(n) +
                  " layers (mtp_num_hidden_layers); lilac supports exactly one");
    return 1;
  }
  int64_t mtp_tensors = 0;

  void load_all() {
    w.layers.resize(size_t(c.num_layers));
    for (int i = 0; i < c.num_layers; ++i) w.layers[size_t(i)].full_attention = c.full_attention[size_t(i)];
    TableOptions opts;
    opts.lm_head = ts.has(names.head + ".weight") || !c.tie_word_embeddings;
    const int mtp = mtp_layers();
    opts.mtp_layers = std::max(mtp, 0);
    w.mtp.layers.resize(size_t(opts.mtp_layers));
    for (auto& L : w.mtp.layers) L.full_attention = true;
    for_each_tensor(c, [&](const TensorSpec& t) {
      if (t.block != TensorBlock::Mtp) return load(t);
      try {
        load(t);
      } catch (const Error& e) {  // a partial head: say what the tensors are
        throw Error(std::string(e.what()) + " (MTP head: the checkpoint has " + std::to_string(mtp_tensors) +
                    " mtp.* tensors, and a head needs all of them; see MODEL_MTP.md)");
      }
    }, opts);
    if (!opts.lm_head) w.lm_head = w.embed;
    for (auto& [name, t] : ts.tensors()) {
      if (used.count(name) || skipped_name(name) || (mtp < 0 && is_mtp_name(name))) continue;
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
  bool mlx_named = false;
  for (auto& [name, t] : ts.tensors())
    if (name.find(".switch_mlp.") != std::string::npos ||
        (name.size() > 7 && name.compare(name.size() - 7, 7, ".scales") == 0)) {
      mlx_named = true;
      break;
    }
  b.layout = (mlx_named || w->config.quantized) ? Layout::MLX : Layout::HF;
  // The full names (with the "language_model" part) or a text-only conversion's ("model.", "lm_head").
  const LayoutNames full = b.layout == Layout::MLX ? mlx_names(true) : hf_names(true);
  const LayoutNames text_only = b.layout == Layout::MLX ? mlx_names(false) : hf_names(false);
  if (ts.has(full.model_prefix + "embed_tokens.weight"))
    b.names = full;
  else if (ts.has(text_only.model_prefix + "embed_tokens.weight"))
    b.names = text_only;
  else
    throw Error("missing tensor '" + full.model_prefix + "embed_tokens.weight' (or '" + text_only.model_prefix +
                "embed_tokens.weight') in " + dir);
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
