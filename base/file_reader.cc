#include "temb/base/file_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace temb {
namespace {

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

absl::Status ReadError(int error, const std::string& path,
                       absl::string_view what) {
  return absl::ErrnoToStatus(
      error, absl::StrCat("cannot read ", what, " \"", path, "\""));
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view what) {
  errno = 0;
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return ReadError(errno, path, what);
  std::string contents;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) {
    contents.append(buffer, n);
  }
  // fopen succeeds on a directory; the read then fails with EISDIR.
  if (std::ferror(file.get()))
    return ReadError(errno ? errno : EIO, path, what);
  return contents;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            absl::string_view what,
                                            uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return ReadError(errno, path, what);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info;
  if (::fstat(fd, &info) != 0) return ReadError(errno, path, what);
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  auto too_large = [&](uint64_t bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", bytes, " bytes is above the limit of ",
                     max_bytes, " for ", what));
  };
  if (static_cast<uint64_t>(info.st_size) > max_bytes) {
    return too_large(static_cast<uint64_t>(info.st_size));
  }
  std::string contents;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ReadError(errno, path, what);
    if (n == 0) break;
    // A file that grows while it is read is bounded all the same.
    if (contents.size() + static_cast<size_t>(n) > max_bytes) {
      return too_large(contents.size() + static_cast<size_t>(n));
    }
    contents.append(buffer, static_cast<size_t>(n));
  }
  return contents;
}

absl::Status CheckJsonDepth(absl::string_view text, int max_depth,
                            absl::string_view what) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": JSON nested deeper than ", max_depth, " levels"));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::OkStatus();
}

}  // namespace temb
