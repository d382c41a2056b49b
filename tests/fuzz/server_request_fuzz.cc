// A request body for POST /v1/completions or /v1/chat/completions -> the server's parsers
// (server/request.h: JSON, every field's type and range, messages, tools, tool_choice,
// reasoning, so_args / response_format, the chat template and tokenization, SamplingParams
// validation), without an engine; the tokenizer is the bundled default model's (it has the
// <think> and DSML tokens). First input byte: bit 0 chat (else completions), bit 1 the V4.1
// chat format; the rest is the body. Oracle: an ApiError is 400 (or 404 for another model)
// with a valid-UTF-8 message and an OpenAI error body that parses; an accepted request has
// prompt ids in the vocabulary, n >= 1, and returns no more choices than it generates. A typed
// deepinfer::Error (which the server also answers with 400) is accepted when its message is valid
// UTF-8; an InternalError (a 500) or any other exception (a nlohmann type_error...) is a finding.
#include <nlohmann/json.hpp>

#include "core/strings.h"
#include "deepinfer/tokenizer.h"
#include "fuzz_util.h"
#include "server/request.h"

namespace {
using namespace deepinfer;

const Tokenizer* tokenizer() {
  static const Tokenizer* t =
      new Tokenizer(Tokenizer::from_file(std::string(DEEPINFER_SOURCE_DIR) + "/assets/default-model/tokenizer.json"));
  return t;
}

server::RequestContext context(server::ChatFormat fmt) {
  server::RequestContext c;
  c.vocab_size = 8192;  // the default model's
  c.model_name = "tiny";
  c.model_path = "/models/tiny";
  c.chat_format = fmt;
  c.tokenizer = tokenizer();
  c.encode = [](std::string_view t) { return tokenizer()->encode(t); };
  c.decode = [](const std::vector<int32_t>& ids) { return tokenizer()->decode(ids); };
  return c;
}

void check_ids(const std::vector<int32_t>& ids) {
  for (int32_t id : ids) FUZZ_ASSERT(id >= 0 && id < 8192, "prompt id %d past the vocabulary\n", id);
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const server::RequestContext v4 = context(server::ChatFormat::kV4), v41 = context(server::ChatFormat::kV41);
  const bool chat = data[0] & 1;
  const server::RequestContext& ctx = (data[0] & 2) ? v41 : v4;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    if (chat) {
      server::ChatRequest r = server::parse_chat_request(ctx, body);
      FUZZ_ASSERT(!r.prompt.empty(), "empty chat prompt\n");
      check_ids(r.prompt);
      FUZZ_ASSERT(r.params.n >= 1, "n %d\n", r.params.n);
    } else {
      server::CompletionRequest r = server::parse_completion_request(ctx, body);
      FUZZ_ASSERT(!r.prompts.empty() && r.prompts.size() == r.echo.size(), "prompts %zu echo %zu\n", r.prompts.size(),
                  r.echo.size());
      for (const auto& p : r.prompts) check_ids(p);
      FUZZ_ASSERT(r.n >= 1 && r.n <= r.params.n, "n %d best_of %d\n", r.n, r.params.n);
    }
  } catch (const server::ApiError& e) {
    const std::string m = e.what();
    FUZZ_ASSERT(e.status == 400 || e.status == 404, "status %d: %s\n", e.status, m.c_str());
    FUZZ_ASSERT(first_invalid_utf8(m) == std::string::npos, "message not valid UTF-8\n");
    const nlohmann::json b = nlohmann::json::parse(server::error_body(e.status, m, e.param, e.code));
    FUZZ_ASSERT(b["error"]["message"].is_string(), "error body without a message\n");
  } catch (const InternalError& e) {
    FUZZ_ASSERT(false, "internal error (a 500): %s\n", e.what());
  } catch (const Error& e) {
    // The server answers a typed deepinfer::Error from a handler with a 400 too.
    FUZZ_ASSERT(first_invalid_utf8(e.what()) == std::string::npos, "message not valid UTF-8\n");
  }
  return 0;
}
