// The two generation endpoints' request bodies, parsed and validated without an engine:
// JSON text -> the engine's inputs (prompt token ids, SamplingParams) and what the response
// needs, or an ApiError (400 naming the field, 404 for another model). The handlers
// (completions.cpp, chat.cpp) add the grammar compile and the job; the fuzz target
// (tests/fuzz/server_request_fuzz.cc) calls these directly with a tokenizer and no engine.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/llm.h"
#include "server/chat_parser.h"
#include "server/protocol.h"

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::server {

enum class ChatFormat { kV4, kV41 };

// What parsing needs from the server. encode / decode / chat_prompt are the model's codec
// (null encode: no tokenizer, text prompts and chat refused).
struct RequestContext {
  int64_t vocab_size = 0;
  std::string model_name, model_path;
  ChatFormat chat_format = ChatFormat::kV4;
  const Tokenizer* tokenizer = nullptr;  // chat templates with tools and reasoning; null = simple codec chat
  std::function<std::vector<int32_t>(std::string_view)> encode;
  std::function<std::string(const std::vector<int32_t>&)> decode;  // for echo
  std::function<std::string(const std::vector<ChatMessage>&, const ChatTemplateOptions&)> chat_prompt;
  std::optional<int32_t> special_id(const std::string& text) const;  // via tokenizer
};

struct CompletionRequest {
  CommonOptions common;
  SamplingParams params;  // params.n = best_of: the candidates generated per prompt
  int n = 1;              // choices returned per prompt (the best n by cumulative logprob)
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo;  // per prompt ("" without echo)
  std::optional<int> logprobs;    // what the client asked for (params.logprobs may be 0 for best_of)
  bool return_token_ids = false;
};
CompletionRequest parse_completion_request(const RequestContext& ctx, const std::string& body);

struct ChatRequest {
  CommonOptions common;
  SamplingParams params;
  std::vector<int32_t> prompt;
  std::optional<int> top_logprobs;
  bool thinking = false, parse_tools = false, return_token_ids = false;
  DsmlSyntax syntax;
};
ChatRequest parse_chat_request(const RequestContext& ctx, const std::string& body);

}  // namespace deepinfer::server
