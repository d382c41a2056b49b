// Registration of binding parts for the deepinfer._C module.
#pragma once
#include <nanobind/nanobind.h>

#include <vector>

namespace deepinfer::py {
using BinderFn = void (*)(nanobind::module_&);
struct Binder {
  const char* name;
  int order;  // lower binds first (types used by later parts bind earlier)
  BinderFn fn;
};
std::vector<Binder>& binders();
struct BinderRegistrar {
  BinderRegistrar(const char* name, int order, BinderFn fn) { binders().push_back({name, order, fn}); }
};
}  // namespace deepinfer::py

#define DI_PY_BINDER(name, order, fn) static ::deepinfer::py::BinderRegistrar di_py_binder_##fn(name, order, fn)
