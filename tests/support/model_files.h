// Helpers of the model-loading tests that write model folders: a fresh folder per test and process, and a copy
// of a model folder (config.json + model.safetensors) whose tensors and config a test edits before writing it.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "model/safetensors.h"

namespace lilac::testutil {

// An empty folder <tmp>/<prefix><tag>_<pid> (removed first if it exists).
inline std::string temp_dir(const std::string& prefix, const std::string& tag) {
  namespace fs = std::filesystem;
  const auto d = fs::temp_directory_path() / (prefix + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

// A tensor held by the test: its name, dtype name, shape and bytes.
struct OwnedTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Copies the model folder `src` (config.json + tensors) to `dst`, letting `edit` change the tensors and
// `edit_config` the config.
inline void rewrite_model(const std::string& src, const std::string& dst,
                          const std::function<void(std::vector<OwnedTensor>&)>& edit,
                          const std::function<void(nlohmann::json&)>& edit_config = nullptr) {
  TensorSet ts = TensorSet::open_dir(src);
  std::vector<OwnedTensor> all;
  for (auto& [name, t] : ts.tensors())
    all.push_back({name, dtype_name(t.dtype), t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
  edit(all);
  std::vector<TensorToWrite> out;
  for (auto& o : all) {
    DType d;
    EXPECT_TRUE(parse_dtype(o.dtype, &d));
    out.push_back({o.name, d, o.shape, o.bytes.data(), o.bytes.size()});
  }
  write_safetensors(dst + "/model.safetensors", out);
  nlohmann::json c = nlohmann::json::parse(read_text_file(src + "/config.json"));
  if (edit_config) edit_config(c);
  write_text_file(dst + "/config.json", c.dump(2));
}

}  // namespace lilac::testutil
