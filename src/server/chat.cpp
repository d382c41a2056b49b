// POST /v1/chat/completions: messages (system, developer, user, assistant with tool_calls and
// reasoning_content, tool) rendered by the model's chat format (V4 or V4.1, src/tokenizer),
// tools + tool_choice, thinking (reasoning_effort, chat_template_kwargs), and the reply split
// by ChatOutputParser into reasoning_content, content and tool_calls, streamed or whole.
// tool_choice "required" or a named function forces the DSML block with a grammar
// (server/tool_grammar.h); with thinking on, the grammar starts after </think> (a trigger).
#include "deepinfer/tokenizer.h"
#include "engine/engine.h"
#include "server/chat_parser.h"
#include "server/job.h"
#include "server/request.h"

namespace deepinfer::server {
namespace {

// OpenAI chat logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
json chat_logprobs(const CompletionOutput& c, int top_n) {
  json content = json::array();
  if (!c.logprobs) return content;
  auto bytes = [](const std::string& s) {
    json b = json::array();
    for (unsigned char ch : s) b.push_back(int(ch));
    return b;
  };
  for (size_t i = 0; i < c.logprobs->size() && i < c.token_ids.size(); ++i) {
    json e = {{"token", ""}, {"logprob", 0.0}, {"bytes", json::array()}, {"top_logprobs", json::array()}};
    std::vector<std::pair<int32_t, const Logprob*>> tops;
    for (const auto& [id, l] : (*c.logprobs)[i]) {
      if (id == c.token_ids[i]) e["token"] = l.decoded_token, e["logprob"] = l.logprob, e["bytes"] = bytes(l.decoded_token);
      if (l.rank <= top_n) tops.emplace_back(l.rank, &l);
    }
    std::sort(tops.begin(), tops.end(), [](auto& a, auto& b) { return a.first < b.first; });
    for (auto& [r, l] : tops)
      e["top_logprobs"].push_back({{"token", l->decoded_token}, {"logprob", l->logprob}, {"bytes", bytes(l->decoded_token)}});
    content.push_back(std::move(e));
  }
  return content;
}

json tool_calls_json(const std::vector<ToolCallDelta>& calls, bool stream) {
  json a = json::array();
  for (const ToolCallDelta& t : calls) {
    json c = {{"index", t.index}, {"function", {{"arguments", t.arguments}}}};
    if (!t.id.empty()) c["id"] = t.id, c["type"] = "function";
    if (!t.name.empty()) c["function"]["name"] = t.name;
    if (!stream) c.erase("index");
    a.push_back(std::move(c));
  }
  return a;
}

class ChatJob final : public Job {
 public:
  ChatJob(ServerState& st, std::shared_ptr<Responder> r, std::string id, const CommonOptions& co, int n,
          const ChatParserOptions& po, std::optional<int> top_logprobs, std::optional<std::vector<int32_t>> prompt_ids)
      : Job(st, std::move(r), "/v1/chat/completions", std::move(id), co, n), top_(top_logprobs), prompt_ids_(std::move(prompt_ids)) {
    for (int i = 0; i < n; ++i) choices_.emplace_back(po);
  }

 private:
  struct Choice {
    explicit Choice(const ChatParserOptions& po) : parser(po) {}
    ChatOutputParser parser;
    ChatDelta all;
    json logprobs = json::array();
    std::string finish;
    bool sent_role = false;
    int64_t reasoning_tokens = 0;
    std::vector<int32_t> token_ids;  // for return_token_ids
  };
  json delta_json(Choice& ch, ChatDelta&& d) {
    json delta = json::object();
    if (!ch.sent_role) delta["role"] = "assistant", ch.sent_role = true;
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty() || (delta.contains("role") && d.reasoning.empty() && d.tool_calls.empty())) delta["content"] = d.content;
    if (!d.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(d.tool_calls, true);
    return delta;
  }
  void send_delta(int i, json delta, const json& logprobs, const std::string& finish) {
    json choice = {{"index", i}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (top_ && !logprobs.empty()) choice["logprobs"] = {{"content", logprobs}};
    if (!finish.empty()) choice["finish_reason"] = finish;
    json chunk = chunk_base("chat.completion.chunk");
    chunk["choices"] = json::array({std::move(choice)});
    emit(chunk);
  }
  void on_piece(int i, const CompletionOutput& c) override {
    Choice& ch = choices_[size_t(i)];
    if (ch.parser.in_reasoning()) ch.reasoning_tokens += int64_t(c.token_ids.size());
    if (prompt_ids_) ch.token_ids.insert(ch.token_ids.end(), c.token_ids.begin(), c.token_ids.end());
    ChatDelta d = ch.parser.feed(c.text);
    json lp = top_ ? chat_logprobs(c, *top_) : json::array();
    if (!stream()) {
      ch.all.append(std::move(d));
      for (json& e : lp) ch.logprobs.push_back(std::move(e));
      return;
    }
    if (d.empty() && lp.empty() && ch.sent_role) return;
    send_delta(i, delta_json(ch, std::move(d)), lp, "");
  }
  std::string finish_reason(Choice& ch, const CompletionOutput& c) {
    if (ch.parser.num_calls() > 0 && (c.finish_reason == "stop" || c.finish_reason.empty())) return "tool_calls";
    return c.finish_reason;
  }
  void on_choice_end(int i, const CompletionOutput& c) override {
    Choice& ch = choices_[size_t(i)];
    ChatDelta d = ch.parser.finish();
    if (ch.parser.malformed()) st_.metrics.count_tool_parse_error();
    ch.finish = finish_reason(ch, c);
    if (!stream()) return ch.all.append(std::move(d));
    if (!d.empty()) send_delta(i, delta_json(ch, std::move(d)), json::array(), "");
    send_delta(i, json::object(), json::array(), ch.finish);
  }
  json response_body() override {
    json body = chunk_base("chat.completion");
    json cs = json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& ch = choices_[i];
      json msg = {{"role", "assistant"}, {"content", nullptr}};
      if (!ch.all.content.empty() || ch.all.tool_calls.empty()) msg["content"] = ch.all.content;
      if (!ch.all.reasoning.empty()) msg["reasoning_content"] = ch.all.reasoning;
      if (!ch.all.tool_calls.empty()) msg["tool_calls"] = tool_calls_json(ch.all.tool_calls, false);
      json c = {{"index", i}, {"message", msg}, {"logprobs", nullptr}, {"finish_reason", ch.finish.empty() ? json(nullptr) : json(ch.finish)}};
      if (top_) c["logprobs"] = {{"content", ch.logprobs}};
      if (prompt_ids_) c["token_ids"] = ch.token_ids;
      cs.push_back(std::move(c));
    }
    body["choices"] = cs;
    if (prompt_ids_) body["prompt_token_ids"] = *prompt_ids_;  // vLLM's return_token_ids
    return body;
  }
  std::optional<int64_t> reasoning_tokens() const override {
    int64_t r = 0;
    for (const Choice& c : choices_) r += c.reasoning_tokens;
    return r;
  }

  std::optional<int> top_;
  std::optional<std::vector<int32_t>> prompt_ids_;
  std::vector<Choice> choices_;
};

}  // namespace

void handle_chat(ServerState& st, const HttpRequest& req, std::shared_ptr<Responder> resp) {
  const double received = engine::now_seconds();
  ChatRequest r = parse_chat_request(st.request, req.body);
  try {
    if (r.params.structured_outputs && st.loop->engine().grammar())
      st.loop->engine().grammar()->compile(*r.params.structured_outputs);  // cached for add_request
  } catch (const Error& e) {
    bad_request(e.what());
  }
  ChatParserOptions po;
  po.thinking = r.thinking;
  po.parse_tools = r.parse_tools;
  po.syntax = r.syntax;
  if (st.tokenizer && st.tokenizer->eos_id()) po.eos_text = st.tokenizer->token_bytes(*st.tokenizer->eos_id());
  const std::string id = st.new_id("chatcmpl");
  po.new_call_id = [id, k = 0]() mutable { return "call_" + id.substr(9) + "_" + std::to_string(k++); };
  auto job = std::make_shared<ChatJob>(st, resp, id, r.common, r.params.n, po, r.top_logprobs,
                                       r.return_token_ids ? std::optional<std::vector<int32_t>>(r.prompt) : std::nullopt);
  job->set_kv(req);
  std::vector<std::vector<int32_t>> prompts;
  prompts.push_back(std::move(r.prompt));
  job->submit(std::move(prompts), r.params, received);
}

}  // namespace deepinfer::server
