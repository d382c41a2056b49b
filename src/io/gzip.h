// Small file helpers on top of zlib, for bundled assets.
#pragma once
#include <string>

namespace deepinfer::io {

// Decompresses the gzip file `src` into `dst` (overwritten). Throws CheckpointError naming
// the file on a missing, truncated or corrupt input, or a failed write.
void gunzip_file(const std::string& src, const std::string& dst);

// Folder of the assets bundled with the source tree (assets/), fixed at build time.
std::string bundled_assets_dir();

}  // namespace deepinfer::io
