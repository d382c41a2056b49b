// Wires the grammar engine (include/deepinfer/structured.h) to the sampler's bitmask when
// the module is built; otherwise structured-output requests are rejected at admission.
#include "engine/adapters.h"

namespace deepinfer::engine {

std::unique_ptr<GrammarCompiler> make_grammar_compiler(const TextCodec* codec, int64_t vocab_size) {
  return nullptr;
}

}  // namespace deepinfer::engine
