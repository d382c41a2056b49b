#include <algorithm>

#include "binder.h"
#include "core/strings.h"
#include "deepinfer/error.h"

namespace nb = nanobind;

namespace deepinfer::py {
std::vector<Binder>& binders() {
  static std::vector<Binder> b;
  return b;
}
}  // namespace deepinfer::py

namespace {
// The Python classes of deepinfer's errors (module lifetime).
struct ErrorTypes {
  PyObject *base, *invalid_argument, *checkpoint, *config, *tokenizer, *grammar;
};

// Messages can quote a user's bytes (a corrupt header, a grammar with a stray byte); Python
// needs valid UTF-8 (PyErr_SetString would raise UnicodeDecodeError instead), so every message
// is escaped on the way out. Registered last, so nanobind tries it first.
void translate(const std::exception_ptr& p, void* payload) {
  const auto* t = static_cast<const ErrorTypes*>(payload);
  auto set = [](PyObject* type, const char* what) {
    PyErr_SetString(type, deepinfer::escape_invalid_utf8(what).c_str());
  };
  try {
    std::rethrow_exception(p);
  } catch (const deepinfer::InvalidArgument& e) {
    set(t->invalid_argument, e.what());
  } catch (const deepinfer::CheckpointError& e) {
    set(t->checkpoint, e.what());
  } catch (const deepinfer::ConfigError& e) {
    set(t->config, e.what());
  } catch (const deepinfer::TokenizerError& e) {
    set(t->tokenizer, e.what());
  } catch (const deepinfer::GrammarError& e) {
    set(t->grammar, e.what());
  } catch (const deepinfer::Error& e) {
    set(t->base, e.what());
  }
  // Anything else: rethrown by the try, left to nanobind's own translators.
}
}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "deepinfer native extension";
  // deepinfer::Error and subclasses surface as deepinfer.Error (a subclass of RuntimeError)
  // and ValueError for bad arguments.
  static nb::object base = nb::exception<deepinfer::Error>(m, "Error", PyExc_RuntimeError);
  static ErrorTypes types{
      base.ptr(),
      nb::exception<deepinfer::InvalidArgument>(m, "InvalidArgument", PyExc_ValueError).ptr(),
      nb::exception<deepinfer::CheckpointError>(m, "CheckpointError", base.ptr()).ptr(),
      nb::exception<deepinfer::ConfigError>(m, "ConfigError", base.ptr()).ptr(),
      nb::exception<deepinfer::TokenizerError>(m, "TokenizerError", base.ptr()).ptr(),
      nb::exception<deepinfer::GrammarError>(m, "GrammarError", base.ptr()).ptr()};
  nb::register_exception_translator(translate, &types);
  auto& b = deepinfer::py::binders();
  std::stable_sort(b.begin(), b.end(), [](auto& x, auto& y) { return x.order < y.order; });
  for (auto& part : b) part.fn(m);
}
