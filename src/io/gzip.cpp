#include "io/gzip.h"

#include <zlib.h>

#include <cstdio>
#include <vector>

#include "core/check.h"

namespace deepinfer::io {

void gunzip_file(const std::string& src, const std::string& dst) {
  gzFile in = gzopen(src.c_str(), "rb");
  if (!in) DI_THROW(CheckpointError, src, ": cannot open");
  std::FILE* out = std::fopen(dst.c_str(), "wb");
  if (!out) {
    gzclose(in);
    DI_THROW(CheckpointError, dst, ": cannot open for writing");
  }
  std::vector<char> buf(1 << 20);
  for (;;) {
    int n = gzread(in, buf.data(), unsigned(buf.size()));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(in, &err);
      gzclose(in);
      std::fclose(out);
      DI_THROW(CheckpointError, src, ": corrupt gzip data: ", msg);
    }
    if (n == 0) break;
    if (std::fwrite(buf.data(), 1, size_t(n), out) != size_t(n)) {
      gzclose(in);
      std::fclose(out);
      DI_THROW(CheckpointError, dst, ": write failed");
    }
  }
  // gzread returns 0 at a clean end and also on a truncated stream; gzclose_r reports the latter.
  int rc = gzclose(in);
  std::fclose(out);
  if (rc != Z_OK) DI_THROW(CheckpointError, src, ": truncated or corrupt gzip file (zlib error ", rc, ")");
}

std::string bundled_assets_dir() { return DEEPINFER_ASSETS_DIR; }

}  // namespace deepinfer::io
