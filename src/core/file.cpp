#include "core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace deepinfer {

const char* file_kind_name(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

bool read_regular_file(const std::string& path, std::string& out, std::string* error, size_t max_bytes) {
  auto fail = [&](const std::string& why) {
    if (error) *error = why;
    return false;
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return fail(detail::str_cat("cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return fail(detail::str_cat("cannot stat: ", std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(detail::str_cat("is ", file_kind_name(st.st_mode), ", not a regular file"));
  }
  if (uint64_t(st.st_size) > max_bytes) {
    ::close(fd);
    return fail(detail::str_cat("is ", st.st_size, " bytes, more than the ", max_bytes, "-byte limit"));
  }
  out.resize(size_t(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return fail(detail::str_cat("read failed: ", std::strerror(e)));
    }
    if (n == 0) break;  // the file shrank while reading
    got += size_t(n);
  }
  ::close(fd);
  out.resize(got);
  return true;
}

}  // namespace deepinfer
