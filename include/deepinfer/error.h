// Public error types. Everything deepinfer throws at its API boundary derives from
// deepinfer::Error; the subclass tells the caller which input was wrong, and what()
// names the file, tensor, field or position.
#pragma once
#include <stdexcept>
#include <string>

namespace deepinfer {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A checkpoint folder, shard, tensor or config.json is missing, malformed or inconsistent.
class CheckpointError : public Error { public: using Error::Error; };
// config.json parses but a field is missing, has the wrong type or contradicts another.
class ConfigError : public Error { public: using Error::Error; };
// A caller passed a bad argument (sampling value, prompt, shape, flag).
class InvalidArgument : public Error { public: using Error::Error; };
// tokenizer.json / tokenizer_config.json problems, or text the tokenizer cannot take.
class TokenizerError : public Error { public: using Error::Error; };
// Regex / JSON schema / EBNF that does not compile, with a position or JSON pointer.
class GrammarError : public Error { public: using Error::Error; };
// Device or host memory budget exceeded in a way that scheduling cannot recover.
class OutOfMemory : public Error { public: using Error::Error; };
// A broken internal invariant: a bug in deepinfer, never the user's fault.
class InternalError : public Error { public: using Error::Error; };

}  // namespace deepinfer
