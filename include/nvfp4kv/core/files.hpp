#pragma once
// Reading the files a user names (layouts, kit manifests, cache dumps, .npy arrays)
// without trusting them: only a regular file is read (a FIFO, a device such as
// /dev/zero or a directory is refused before a byte is read, and opening never
// waits for a writer), and its size is checked from stat against what the caller
// expects before any allocation. Errors are ArgumentError naming the file.
#include <cstdint>
#include <string>
#include <vector>

namespace nvfp4kv {

// An open regular file (symlinks followed), read front to back.
class RegularFile {
 public:
  // `what` names the file in messages ("--cache kv", "the kit's manifest").
  RegularFile(const std::string& path, const std::string& what);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  int64_t size() const { return size_; }         // bytes, from fstat
  int64_t remaining() const { return size_ - position_; }
  // Exactly `bytes` more bytes, or an error naming the file (truncated meanwhile).
  void read(void* to, int64_t bytes);
  const std::string& label() const { return label_; }

 private:
  int fd_ = -1;
  int64_t size_ = 0, position_ = 0;
  std::string label_;  // "what (path)"
};

// The whole of a regular file of at most `max_bytes`; anything larger is refused from its size.
std::vector<uint8_t> read_regular_file(const std::string& path, int64_t max_bytes, const std::string& what);
// The same as text.
std::string read_text_file(const std::string& path, int64_t max_bytes, const std::string& what);
// Refuses an output path that exists and is not a regular file (a FIFO would block the
// write, a directory or device would not hold the result).
void require_writable_path(const std::string& path, const std::string& what);

}  // namespace nvfp4kv
