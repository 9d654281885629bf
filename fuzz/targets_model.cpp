// Fuzz targets of model files: the safetensors header and config.json, as a downloaded (or hostile)
// checkpoint would give them.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "core/error.h"
#include "fuzz/fuzz_target.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace {

using lilac::fuzz::violated;

// The file each input is written to (one per process), removed when the process ends.
struct TempFile {
  std::string path = "/tmp/lilac_fuzz_" + std::to_string(getpid()) + ".safetensors";
  ~TempFile() { std::remove(path.c_str()); }
};

const std::string& temp_file() {
  static const TempFile f;
  return f.path;
}

}  // namespace

// Any bytes as a .safetensors file: either an error naming the file, or tensors whose bytes lie inside
// the file and agree with shape x dtype (so every read of `numel` elements stays inside the mapping).
LILAC_FUZZ_TARGET(safetensors, "a file is rejected naming it, or every tensor's numel x dtype size bytes lie inside it") {
  const std::string path = temp_file();
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    lilac::SafetensorsFile st(path);
    const uint8_t* lo = st.mapping()->data();
    const uint8_t* hi = lo + st.mapping()->size();
    for (const auto& [name, t] : st.tensors()) {
      unsigned __int128 want = 1;
      for (int64_t d : t.shape) want *= static_cast<unsigned __int128>(d);
      want *= lilac::dtype_size(t.dtype);
      if (want != t.nbytes)
        violated("safetensors", "tensor '" + name + "' of shape " + t.shape_str() + " holds " + std::to_string(t.nbytes) +
                                    " bytes, not numel x dtype size");
      if (t.nbytes && (t.data < lo || t.data + t.nbytes > hi)) violated("safetensors", "tensor '" + name + "' lies outside the file");
      if (t.nbytes) (void)lilac::tensor_float_at(t, t.numel() - 1);
    }
  } catch (const lilac::Error& e) {
    if (std::string(e.what()).find(path) == std::string::npos) violated("safetensors", std::string("error does not name the file: ") + e.what());
  } catch (const std::exception& e) {
    violated("safetensors", std::string("not a lilac::Error: ") + e.what());
  }
}

// Any text as config.json (+ generation_config.json after a NUL): parsed, or an error naming the file.
LILAC_FUZZ_TARGET(config, "config.json text is parsed or rejected with an error naming it") {
  std::string text(reinterpret_cast<const char*>(data), size), gen;
  if (auto z = text.find('\0'); z != std::string::npos) {
    gen = text.substr(z + 1);
    text.resize(z);
  }
  try {
    const lilac::ModelConfig c = lilac::parse_config(text, "fuzz/config.json", gen);
    (void)c.num_attention_layers();
  } catch (const lilac::Error& e) {
    if (std::string(e.what()).find("config.json") == std::string::npos) violated("config", std::string("error does not name the file: ") + e.what());
  } catch (const std::exception& e) {
    violated("config", std::string("not a lilac::Error: ") + e.what());
  }
}
