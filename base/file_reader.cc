#include "temb/base/file_reader.h"

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

}  // namespace temb
