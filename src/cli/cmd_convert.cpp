// `lilac convert --model HF_DIR --out DIR`: quantize a Hugging Face checkpoint to the MLX 4-bit layout.
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "model/hf_writer.h"

namespace lilac::cli {
namespace {

struct ConvertArgs {
  std::string model, out;
  double shard_gb = 5.0;
  bool no_progress = false;
};

const bool registered = register_command(Command{
    "convert",
    "Convert a Hugging Face checkpoint (bf16/f32) to the MLX 4-bit layout lilac loads fastest",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<ConvertArgs>();
      sub.add_option("--model", a->model, "Hugging Face checkpoint folder (config.json + safetensors)")->required();
      sub.add_option("--out", a->out, "output folder (created if needed)")->required();
      sub.add_option("--shard-gb", a->shard_gb, "split model.safetensors into shards of about this size (GB)")
          ->check(CLI::PositiveNumber);
      sub.add_flag("--no-progress", a->no_progress, "do not show progress on stderr");
      return [a]() -> int {
        WriteOptions o;
        o.shard_bytes = uint64_t(a->shard_gb * 1e9);
        o.progress = !a->no_progress;
        convert_checkpoint(a->model, a->out, o);
        std::fprintf(stderr, "lilac: wrote %s (MLX 4-bit layout)\n", a->out.c_str());
        return 0;
      };
    }});

}  // namespace
}  // namespace lilac::cli
