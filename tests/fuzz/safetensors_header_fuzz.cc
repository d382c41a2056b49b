// A whole .safetensors file (8-byte header length, JSON header, data) -> SafetensorsFile::open.
// On success every tensor view's first and last byte is read (a range past the mapping would
// fault) and dims * dtype size must equal the byte range.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  static const auto path = di_fuzz::scratch_dir() / "model.safetensors";
  di_fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  di_fuzz::expect_named_error([&] {
    auto f = io::SafetensorsFile::open(path.string());
    volatile uint8_t sink = 0;
    for (const io::TensorInfo& ti : f->tensors()) {
      Tensor t = f->tensor(ti);
      FUZZ_ASSERT(t.nbytes() == ti.end - ti.begin, "tensor %s: %zu bytes for range %llu", ti.name.c_str(), t.nbytes(),
                  (unsigned long long)(ti.end - ti.begin));
      if (t.nbytes() == 0) continue;
      const auto* p = static_cast<const uint8_t*>(t.raw_data());
      sink = sink + p[0] + p[t.nbytes() - 1];
    }
    for (const auto& [k, v] : f->metadata()) sink = sink + uint8_t(k.size() + v.size());
  });
  return 0;
}
