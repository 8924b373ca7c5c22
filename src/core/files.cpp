#include "nvfp4kv/core/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "nvfp4kv/core/error.hpp"

namespace nvfp4kv {
namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

std::string not_regular(const std::string& label, mode_t m) {
  return label + " is " + kind_of(m) + ": only a regular file is read (save the data to a file first)";
}

std::string size_text(int64_t n) {
  std::string s = std::to_string(n) + " bytes";
  if (n >= (int64_t(1) << 20)) s += " (" + std::to_string(n >> 20) + " MiB)";
  return s;
}

}  // namespace

RegularFile::RegularFile(const std::string& path, const std::string& what)
    : label_(what.empty() ? path : what + " (" + path + ")") {
  // O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a
  // writer; fstat on the descriptor then refuses it, so no race with a renamed file.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) throw ArgumentError("cannot read " + label_ + ": " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t m = st.st_mode;
    ::close(fd_);
    fd_ = -1;
    throw ArgumentError(not_regular(label_, m));
  }
  size_ = int64_t(st.st_size);
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

void RegularFile::read(void* to, int64_t bytes) {
  if (bytes < 0 || bytes > remaining())
    throw ArgumentError(label_ + " is " + size_text(size_) + ", too short to hold " + std::to_string(bytes) +
                        " more bytes after byte " + std::to_string(position_));
  auto* p = static_cast<char*>(to);
  while (bytes > 0) {
    const ssize_t got = ::read(fd_, p, size_t(std::min<int64_t>(bytes, int64_t(1) << 30)));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) throw ArgumentError("cannot read " + label_ + ": " + (got < 0 ? std::strerror(errno) : "it ended early"));
    p += got;
    bytes -= got;
    position_ += got;
  }
}

std::vector<uint8_t> read_regular_file(const std::string& path, int64_t max_bytes, const std::string& what) {
  RegularFile f(path, what);
  if (f.size() > max_bytes)
    throw ArgumentError(f.label() + " is " + size_text(f.size()) + "; at most " + size_text(max_bytes) + " is expected");
  std::vector<uint8_t> bytes(size_t(f.size()));
  f.read(bytes.data(), f.size());
  return bytes;
}

std::string read_text_file(const std::string& path, int64_t max_bytes, const std::string& what) {
  const std::vector<uint8_t> b = read_regular_file(path, max_bytes, what);
  return std::string(b.begin(), b.end());
}

void require_writable_path(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw ArgumentError(what + " (" + path + ") is " + kind_of(st.st_mode) + ": give a regular file to write");
}

}  // namespace nvfp4kv
