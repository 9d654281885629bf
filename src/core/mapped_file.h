// A read-only memory-mapped file. The mapping lives as long as the object (share it with
// std::shared_ptr when views into it outlive the loader).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace lilac {

class MappedFile {
 public:
  // Maps the whole file read-only. Throws lilac::Error naming the path when it cannot.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  static std::shared_ptr<const MappedFile> open(const std::string& path) {
    return std::make_shared<const MappedFile>(path);
  }

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Hint the kernel to read [offset, offset + len) ahead (no-op where unsupported).
  void prefetch(size_t offset, size_t len) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Whole file as a string (small text files: config.json, ...). Throws lilac::Error naming the path.
std::string read_text_file(const std::string& path);
// Write a whole file (throws lilac::Error naming the path).
void write_text_file(const std::string& path, const std::string& text);
bool file_exists(const std::string& path);
// "dir/name" (no doubled slash).
std::string path_join(const std::string& dir, const std::string& name);

}  // namespace lilac
