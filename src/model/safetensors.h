// safetensors files: reader (memory-mapped, validated) for one file or a sharded folder, and a writer.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// then the data; offsets are relative to the end of the header.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace lilac {

enum class DType { F32, F16, BF16, U32, I32, U8, I8, I64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "F32", "BF16", ...
// Parses a safetensors dtype string; returns false for dtypes lilac does not read.
bool parse_dtype(const std::string& s, DType* out);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping (may be unaligned if the file says so)
  size_t nbytes = 0;
  std::string file;  // path of the file holding it (for messages)

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  std::string shape_str() const;  // "[2048, 32]"
};

// One .safetensors file, mapped and validated (dtypes, shapes, offsets inside the file and
// consistent with shape x dtype, no overlapping tensors).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return file_->path(); }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::shared_ptr<const MappedFile> mapping() const { return file_; }

 private:
  std::shared_ptr<const MappedFile> file_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint folder: `model.safetensors.index.json` + shards, else `model.safetensors`.
class TensorSet {
 public:
  static TensorSet open_dir(const std::string& dir);
  static TensorSet open_file(const std::string& path);

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo* find(const std::string& name) const;
  // Throws lilac::Error "missing tensor NAME in DIR".
  const TensorInfo& get(const std::string& name) const;
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::vector<std::shared_ptr<const MappedFile>>& files() const { return files_; }
  const std::string& origin() const { return origin_; }
  uint64_t total_bytes() const;

 private:
  void add_file(const SafetensorsFile& f);
  std::string origin_;
  std::map<std::string, TensorInfo> tensors_;
  std::vector<std::shared_ptr<const MappedFile>> files_;
};

// Element `i` of a float tensor (F32, F16 or BF16) as float; throws for other dtypes.
float tensor_float_at(const TensorInfo& t, int64_t i);
// Elements [offset, offset + n) of a float tensor (F32, F16, BF16) as floats into out[n].
void tensor_floats(const TensorInfo& t, int64_t offset, int64_t n, float* out);
// The whole tensor as floats (F32, F16, BF16).
std::vector<float> tensor_to_floats(const TensorInfo& t);

// ---- writer ----
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // numel * dtype_size bytes, little-endian
  size_t nbytes = 0;
};

// Writes one file (header padded to 8 bytes, data ordered by element size then name, so every tensor
// is aligned). Throws naming the path.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes `dir/model.safetensors` when the total is at most `shard_bytes`, else
// `dir/model-0000k-of-0000n.safetensors` shards + `dir/model.safetensors.index.json`.
// `on_bytes` (optional) is called with the number of bytes written as it goes.
void write_safetensors_sharded(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                               uint64_t shard_bytes = uint64_t(5) * 1000 * 1000 * 1000,
                               const std::map<std::string, std::string>& metadata = {},
                               void (*on_bytes)(void*, uint64_t) = nullptr, void* ctx = nullptr);

}  // namespace lilac
