#include "model/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"

namespace lilac {

using json = nlohmann::json;

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::U32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::U8: case DType::I8: return 1;
    case DType::I64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::U32: return "U32";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
    case DType::I64: return "I64";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> table[] = {
      {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"U32", DType::U32},
      {"I32", DType::I32}, {"U8", DType::U8},   {"I8", DType::I8},     {"I64", DType::I64}};
  for (auto& [n, d] : table)
    if (s == n) {
      *out = d;
      return true;
    }
  return false;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(MappedFile::open(path)) {
  const uint8_t* base = file_->data();
  const size_t size = file_->size();
  if (size < 8) throw Error(path + ": truncated safetensors file (" + std::to_string(size) + " bytes, no header)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];
  if (n > size - 8)
    throw Error(path + ": safetensors header length " + std::to_string(n) + " exceeds the file size " +
                std::to_string(size) + " (truncated or not a safetensors file)");
  if (n > (uint64_t(100) << 20)) throw Error(path + ": safetensors header too large (" + std::to_string(n) + " bytes)");
  json h;
  try {
    h = json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + n));
  } catch (const json::exception& e) {
    throw Error(path + ": invalid safetensors header JSON: " + e.what());
  }
  if (!h.is_object()) throw Error(path + ": safetensors header is not a JSON object");
  const uint8_t* data = base + 8 + n;
  const uint64_t data_size = size - 8 - n;
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>> spans;
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      if (v.is_object())
        for (auto& [k, mv] : v.items())
          if (mv.is_string()) metadata_[k] = mv.get<std::string>();
      continue;
    }
    auto where = path + ": tensor '" + name + "'";
    if (!v.is_object()) throw Error(where + ": header entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) throw Error(where + ": missing or invalid 'dtype'");
    TensorInfo t;
    t.name = name;
    t.file = path;
    std::string dt = v["dtype"].get<std::string>();
    if (!parse_dtype(dt, &t.dtype))
      throw Error(where + " has unsupported dtype '" + dt + "' (lilac reads F32, F16, BF16, U32, I32, U8, I8, I64)");
    if (!v.contains("shape") || !v["shape"].is_array()) throw Error(where + ": missing or invalid 'shape'");
    uint64_t numel = 1;
    for (auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) throw Error(where + ": invalid shape entry " + d.dump());
      int64_t dv = d.get<int64_t>();
      if (dv != 0 && numel > (uint64_t(1) << 62) / uint64_t(dv)) throw Error(where + ": shape too large");
      numel *= uint64_t(dv);
      t.shape.push_back(dv);
    }
    const json off = v.contains("data_offsets") ? v["data_offsets"] : json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw Error(where + ": missing or invalid 'data_offsets'");
    uint64_t a = off[0].get<uint64_t>(), b = off[1].get<uint64_t>();
    if (b < a) throw Error(where + ": data_offsets [" + std::to_string(a) + ", " + std::to_string(b) + "] are reversed");
    uint64_t expect = 0;  // numel x dtype size, which can wrap past 2^64 (2^62 F32 elements are 0 bytes)
    if (__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &expect))
      throw Error(where + ": shape " + t.shape_str() + " x " + dt + " is more than 2^64 bytes");
    if (b - a != expect)
      throw Error(where + ": data_offsets span " + std::to_string(b - a) + " bytes but shape " + t.shape_str() +
                  " x " + dt + " needs " + std::to_string(expect));
    if (b > data_size)
      throw Error(where + ": data_offsets [" + std::to_string(a) + ", " + std::to_string(b) +
                  "] lie outside the file (data section is " + std::to_string(data_size) +
                  " bytes; file truncated?)");
    t.data = data + a;
    t.nbytes = size_t(b - a);
    if (b > a) spans.push_back({{a, b}, name});
    tensors_.emplace(name, std::move(t));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first.first < spans[i - 1].first.second)
      throw Error(path + ": tensors '" + spans[i - 1].second + "' and '" + spans[i].second + "' overlap");
}

const TensorInfo* TensorSet::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorInfo& TensorSet::get(const std::string& name) const {
  auto* t = find(name);
  if (!t) throw Error("missing tensor '" + name + "' in " + origin_);
  return *t;
}

uint64_t TensorSet::total_bytes() const {
  uint64_t s = 0;
  for (auto& [n, t] : tensors_) s += t.nbytes;
  return s;
}

void TensorSet::add_file(const SafetensorsFile& f) {
  files_.push_back(f.mapping());
  for (auto& [name, t] : f.tensors()) {
    auto [it, fresh] = tensors_.emplace(name, t);
    if (!fresh) throw Error("tensor '" + name + "' appears in both " + it->second.file + " and " + t.file);
  }
}

TensorSet TensorSet::open_file(const std::string& path) {
  TensorSet s;
  s.origin_ = path;
  s.add_file(SafetensorsFile(path));
  return s;
}

TensorSet TensorSet::open_dir(const std::string& dir) {
  std::string index = path_join(dir, "model.safetensors.index.json");
  std::string single = path_join(dir, "model.safetensors");
  if (file_exists(index)) {
    json j;
    try {
      j = json::parse(read_text_file(index));
    } catch (const json::exception& e) {
      throw Error(index + ": invalid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index + ": missing 'weight_map' object");
    std::map<std::string, std::string> wm;
    std::vector<std::string> shards;
    for (auto& [name, f] : j["weight_map"].items()) {
      if (!f.is_string()) throw Error(index + ": weight_map entry '" + name + "' is not a file name");
      std::string fn = f.get<std::string>();
      if (fn.find('/') != std::string::npos || fn == ".." || fn.empty())
        throw Error(index + ": weight_map entry '" + name + "' names an invalid shard file '" + fn + "'");
      wm[name] = fn;
      if (std::find(shards.begin(), shards.end(), fn) == shards.end()) shards.push_back(fn);
    }
    std::sort(shards.begin(), shards.end());
    TensorSet s;
    s.origin_ = dir;
    for (auto& fn : shards) s.add_file(SafetensorsFile(path_join(dir, fn)));
    for (auto& [name, fn] : wm) {
      auto* t = s.find(name);
      if (!t) throw Error(index + ": tensor '" + name + "' is listed in shard " + fn + " but not found there");
      if (t->file != path_join(dir, fn))
        throw Error(index + ": tensor '" + name + "' is listed in shard " + fn + " but found in " + t->file);
    }
    return s;
  }
  if (file_exists(single)) {
    TensorSet s = open_file(single);
    s.origin_ = dir;
    return s;
  }
  throw Error("no model.safetensors or model.safetensors.index.json in " + dir);
}

float tensor_float_at(const TensorInfo& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      return f;
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return bf16_to_f32(h);
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return f16_to_f32(h);
    }
    default:
      throw Error(t.file + ": tensor '" + t.name + "' has dtype " + dtype_name(t.dtype) +
                  ", expected a float dtype (F32, F16 or BF16)");
  }
}

void tensor_floats(const TensorInfo& t, int64_t offset, int64_t n, float* out) {
  if (t.dtype == DType::F32) {
    std::memcpy(out, t.data + 4 * offset, size_t(n) * 4);
  } else if (t.dtype == DType::BF16) {
    const uint8_t* p = t.data + 2 * offset;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = bf16_to_f32(h);
    }
  } else if (t.dtype == DType::F16) {
    const uint8_t* p = t.data + 2 * offset;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = f16_to_f32(h);
    }
  } else {
    tensor_float_at(t, 0);  // throws the dtype error
  }
}

std::vector<float> tensor_to_floats(const TensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16) tensor_float_at(t, 0);  // throws
  tensor_floats(t, 0, t.numel(), out.data());
  return out;
}

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};

void write_one(const std::string& path, std::vector<const TensorToWrite*> list,
               const std::map<std::string, std::string>& metadata, void (*on_bytes)(void*, uint64_t),
               void* ctx) {
  // Larger element sizes first (then by name): with the header padded to 8 bytes every tensor's data
  // is aligned to its element size, and the data section has no holes.
  std::sort(list.begin(), list.end(), [](auto* a, auto* b) {
    size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (auto* t : list) {
    uint64_t numel = 1;
    for (auto d : t->shape) numel *= uint64_t(d);
    if (numel * dtype_size(t->dtype) != t->nbytes)
      throw Error("write_safetensors: tensor '" + t->name + "' has " + std::to_string(t->nbytes) +
                  " bytes, its shape and dtype need " + std::to_string(numel * dtype_size(t->dtype)));
    h[t->name] = {{"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {off, off + t->nbytes}}};
    off += t->nbytes;
  }
  std::string hs = h.dump();
  while (hs.size() % 8) hs.push_back(' ');
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (!f) throw Error("cannot create " + path + ": " + std::strerror(errno));
  uint8_t len[8];
  uint64_t n = hs.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f.get()) == 8 && std::fwrite(hs.data(), 1, hs.size(), f.get()) == hs.size();
  for (auto* t : list) {
    if (!ok) break;
    const uint8_t* p = static_cast<const uint8_t*>(t->data);
    size_t left = t->nbytes;
    while (ok && left) {
      size_t chunk = std::min<size_t>(left, size_t(64) << 20);
      ok = std::fwrite(p, 1, chunk, f.get()) == chunk;
      p += chunk;
      left -= chunk;
      if (on_bytes) on_bytes(ctx, chunk);
    }
  }
  if (!ok) throw Error("cannot write " + path + ": " + std::strerror(errno));
  std::FILE* raw = f.release();
  if (std::fclose(raw) != 0) throw Error("cannot write " + path + ": " + std::strerror(errno));
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> list;
  for (auto& t : tensors) list.push_back(&t);
  write_one(path, list, metadata, nullptr, nullptr);
}

void write_safetensors_sharded(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                               uint64_t shard_bytes, const std::map<std::string, std::string>& metadata,
                               void (*on_bytes)(void*, uint64_t), void* ctx) {
  std::vector<const TensorToWrite*> list;
  uint64_t total = 0;
  std::set<std::string> names;
  for (auto& t : tensors) {
    if (!names.insert(t.name).second) throw Error("write_safetensors: duplicate tensor '" + t.name + "'");
    list.push_back(&t);
    total += t.nbytes;
  }
  std::sort(list.begin(), list.end(), [](auto* a, auto* b) { return a->name < b->name; });
  if (total <= shard_bytes) {
    write_one(path_join(dir, "model.safetensors"), list, metadata, on_bytes, ctx);
    return;
  }
  std::vector<std::vector<const TensorToWrite*>> shards(1);
  uint64_t cur = 0;
  for (auto* t : list) {
    if (cur > 0 && cur + t->nbytes > shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(t);
    cur += t->nbytes;
  }
  json wm = json::object();
  char buf[64];
  for (size_t k = 0; k < shards.size(); ++k) {
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    write_one(path_join(dir, buf), shards[k], metadata, on_bytes, ctx);
    for (auto* t : shards[k]) wm[t->name] = buf;
  }
  json idx = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
  write_text_file(path_join(dir, "model.safetensors.index.json"), idx.dump(2) + "\n");
}

}  // namespace lilac
