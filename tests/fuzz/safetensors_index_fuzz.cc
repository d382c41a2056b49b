// model.safetensors.index.json text -> Checkpoint::open on a folder holding it and two valid
// shards. On success the index must agree with where each tensor was found.
#include "fuzz_util.h"
#include "io/safetensors.h"

namespace {
const std::filesystem::path& folder() {
  static const auto dir = [] {
    using namespace deepinfer;
    auto d = di_fuzz::scratch_dir() / "ckpt";
    std::filesystem::create_directories(d);
    for (int s = 0; s < 2; ++s) {
      io::SafetensorsWriter w;
      std::vector<float> v = {1.f, 2.f, 3.f};
      w.add(s == 0 ? "a" : "b", Tensor::from_vector(v, {3}));
      w.add(s == 0 ? "layers.0.w" : "layers.1.w", Tensor::from_vector(v, {1, 3}));
      w.write((d / (s == 0 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors")).string());
    }
    return d;
  }();
  return dir;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  const auto& dir = folder();
  di_fuzz::write_file(dir / "model.safetensors.index.json", std::string_view(reinterpret_cast<const char*>(data), size));
  di_fuzz::expect_named_error([&] {
    io::Checkpoint c = io::Checkpoint::open(dir.string());
    for (const std::string& n : c.names()) FUZZ_ASSERT(c.get(n).numel() > 0, "tensor %s", n.c_str());
  });
  return 0;
}
