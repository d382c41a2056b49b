#include <algorithm>

#include "binder.h"
#include "deepinfer/error.h"

namespace nb = nanobind;

namespace deepinfer::py {
std::vector<Binder>& binders() {
  static std::vector<Binder> b;
  return b;
}
}  // namespace deepinfer::py

NB_MODULE(_C, m) {
  m.doc() = "deepinfer native extension";
  // deepinfer::Error and subclasses surface as deepinfer.Error (a subclass of RuntimeError)
  // and ValueError for bad arguments.
  static nb::object base = nb::exception<deepinfer::Error>(m, "Error", PyExc_RuntimeError);
  nb::exception<deepinfer::InvalidArgument>(m, "InvalidArgument", PyExc_ValueError);
  nb::exception<deepinfer::CheckpointError>(m, "CheckpointError", base.ptr());
  nb::exception<deepinfer::ConfigError>(m, "ConfigError", base.ptr());
  nb::exception<deepinfer::TokenizerError>(m, "TokenizerError", base.ptr());
  nb::exception<deepinfer::GrammarError>(m, "GrammarError", base.ptr());
  auto& b = deepinfer::py::binders();
  std::stable_sort(b.begin(), b.end(), [](auto& x, auto& y) { return x.order < y.order; });
  for (auto& part : b) part.fn(m);
}
