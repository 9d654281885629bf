// Checkpoint writers: an HF-layout copy (dequantized, F32) and the MLX 4-bit layout (`lilac convert`,
// `lilac make-demo`). Tensor names come from the table (model/tensor_table.h).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/weights.h"

namespace lilac {

struct WriteOptions {
  uint64_t shard_bytes = uint64_t(5) * 1000 * 1000 * 1000;  // split into shards + index above this
  bool progress = true;  // bytes / rate / ETA on stderr when it is a terminal and the job is large
};

// Writes `out_dir` (created if needed) in the original Hugging Face layout: `model.language_model.*`,
// `lm_head.weight`, every matrix dequantized to F32, experts fused (`mlp.experts.gate_up_proj`
// [E, 2I, H], `mlp.experts.down_proj` [E, H, I]), zero-centred norms without the +1, conv1d [C, 1, K];
// config.json = the source folder's (w.dir) without `quantization`, else one made from w.config;
// generation_config.json copied when the source has one.
void write_hf_checkpoint(const ModelWeights& w, const std::string& out_dir);
void write_hf_checkpoint(const ModelWeights& w, const std::string& out_dir, const WriteOptions& opts);

// Writes `out_dir` in the MLX layout (`language_model.model.*`, `language_model.lm_head`, experts as
// `mlp.switch_mlp.{gate,up,down}_proj`, +1 baked into zero-centred norms, conv1d [C, K, 1]); quantized
// matrices as .weight U32 / .scales / .biases BF16, dense ones and vectors as BF16 when that is exact,
// else F32; config.json with a `quantization` block (default + per-tensor overrides for 8-bit ones).
void write_mlx_checkpoint(const ModelWeights& w, const std::string& out_dir, const WriteOptions& opts = {});
// Only the tensors of write_mlx_checkpoint (model.safetensors or shards); returns the `quantization` block
// their config.json needs (for writers of their own config.json, e.g. `lilac make-demo`).
nlohmann::json write_mlx_tensors(const ModelWeights& w, const std::string& out_dir, const WriteOptions& opts = {});

// `lilac convert`: load `model_dir` (HF layout: quantized on load to 4-bit, router and
// shared_expert_gate 8-bit) and write it to `out_dir` in the MLX layout, copying tokenizer.json,
// tokenizer_config.json, chat_template.jinja and generation_config.json when present.
void convert_checkpoint(const std::string& model_dir, const std::string& out_dir, const WriteOptions& opts = {});

// A flat text config.json (model_type qwen3_5_moe_text) describing `c` (used when no source file exists).
std::string config_to_json(const ModelConfig& c);

}  // namespace lilac
