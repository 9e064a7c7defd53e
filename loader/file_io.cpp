// file_io: regular-file checks and whole-file reads for the loaders (see file_io.h).
#include "loader/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace linnet {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void sys_error(const std::string& what, const std::string& file, int err) {
  throw Error(what + ": " + std::strerror(err), file);
}

void require_regular(const struct stat& st, const std::string& file, const char* what) {
  if (!S_ISREG(st.st_mode))
    throw Error(std::string(what) + " is not a regular file", file, "a regular file",
                kind_of(st.st_mode));
}

}  // namespace

RegularFile::RegularFile(const std::filesystem::path& path, const char* what) {
  const std::string file = path.string();
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) sys_error(std::string("cannot open ") + what, file, errno);
  require_regular(st, file, what);
  fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) sys_error(std::string("cannot open ") + what, file, errno);
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    sys_error(std::string("cannot stat ") + what, file, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    require_regular(st, file, what);
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(std::exchange(other.size_, 0)) {}

std::string read_text_file(const std::filesystem::path& path, const char* what) {
  const RegularFile f(path, what);
  std::string text;
  text.reserve(static_cast<std::size_t>(f.size()));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd(), buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      sys_error(std::string("cannot read ") + what, path.string(), errno);
    }
    text.append(buf, static_cast<std::size_t>(n));
  }
  return text;
}

}  // namespace linnet
