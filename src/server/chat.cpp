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
#include "server/tool_grammar.h"

namespace deepinfer::server {
namespace {

std::string content_text(const json* c, const std::string& where) {
  if (!c) return "";
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) bad_request("'" + where + "' must be a string, an array of content parts, or null", where);
  std::string out;
  for (size_t i = 0; i < c->size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    if (!(*c)[i].is_object()) bad_request("'" + w + "' must be a content part object", w);
    Fields p((*c)[i], w);
    const std::string type = p.str("type").value_or("");
    if (type != "text") bad_request("'" + w + ".type' must be 'text' (this model reads text only), got '" + type + "'", w + ".type");
    out += p.str("text").value_or("");
    p.check_unknown();
  }
  return out;
}

std::vector<ToolCall> parse_tool_calls(const json& v, const std::string& where) {
  if (!v.is_array()) bad_request("'" + where + "' must be an array", where);
  std::vector<ToolCall> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    if (!v[i].is_object()) bad_request("'" + w + "' must be an object", w);
    Fields f(v[i], w);
    ToolCall tc;
    tc.id = f.str("id").value_or("");
    if (auto t = f.str("type"); t && *t != "function") bad_request("'" + w + ".type' must be 'function'", w + ".type");
    const json* fn = f.get("function");
    if (!fn || !fn->is_object()) bad_request("'" + w + ".function' must be an object", w + ".function");
    Fields g(*fn, w + ".function");
    auto name = g.str("name");
    if (!name || name->empty()) bad_request("'" + w + ".function.name' is required", w + ".function.name");
    tc.name = *name;
    tc.arguments = g.str("arguments").value_or("{}");
    g.check_unknown();
    f.check_unknown();
    out.push_back(std::move(tc));
  }
  return out;
}

std::vector<Message> parse_messages(const json* v) {
  if (!v || !v->is_array() || v->empty()) bad_request("'messages' must be a non-empty array", "messages");
  std::vector<Message> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string w = "messages[" + std::to_string(i) + "]";
    if (!(*v)[i].is_object()) bad_request("'" + w + "' must be an object", w);
    Fields f((*v)[i], w);
    Message m;
    auto role = f.str("role");
    if (!role) bad_request("'" + w + ".role' is required", w + ".role");
    m.role = *role;
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    if (std::find(std::begin(kRoles), std::end(kRoles), m.role) == std::end(kRoles))
      bad_request("'" + w + ".role' must be one of system, developer, user, assistant, tool; got '" + m.role + "'", w + ".role");
    m.content = content_text(f.get("content"), w + ".content");
    f.str("name");  // accepted, not rendered
    if (m.role == "assistant") {
      if (const json* tc = f.get("tool_calls")) m.tool_calls = parse_tool_calls(*tc, w + ".tool_calls");
      if (auto r = f.str("reasoning_content")) m.reasoning_content = *r;
      else if (auto r2 = f.str("reasoning")) m.reasoning_content = *r2;
    }
    if (m.role == "tool") m.tool_call_id = f.str("tool_call_id").value_or("");
    f.check_unknown();
    out.push_back(std::move(m));
  }
  return out;
}

struct ToolChoice {
  std::string mode = "auto";  // none | auto | required | named
  std::string name;
};

std::vector<ToolSpec> parse_tools(const json* v) {
  std::vector<ToolSpec> out;
  if (!v) return out;
  if (!v->is_array()) bad_request("'tools' must be an array", "tools");
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string w = "tools[" + std::to_string(i) + "]";
    if (!(*v)[i].is_object()) bad_request("'" + w + "' must be an object", w);
    Fields f((*v)[i], w);
    if (f.str("type").value_or("function") != "function") bad_request("'" + w + ".type' must be 'function'", w + ".type");
    const json* fn = f.get("function");
    if (!fn || !fn->is_object()) bad_request("'" + w + ".function' must be an object", w + ".function");
    Fields g(*fn, w + ".function");
    ToolSpec t;
    auto name = g.str("name");
    if (!name || name->empty()) bad_request("'" + w + ".function.name' is required", w + ".function.name");
    t.name = *name;
    g.str("description");
    g.boolean("strict");
    if (const json* p = g.get("parameters")) {
      if (!p->is_object()) bad_request("'" + w + ".function.parameters' must be a JSON schema object", w + ".function.parameters");
      t.parameters = *p;
    }
    g.check_unknown();
    f.check_unknown();
    out.push_back(std::move(t));
  }
  return out;
}

ToolChoice parse_tool_choice(const json* v, const std::vector<ToolSpec>& tools) {
  ToolChoice c;
  if (!v) {
    c.mode = tools.empty() ? "none" : "auto";
    return c;
  }
  if (v->is_string()) {
    c.mode = v->get<std::string>();
    if (c.mode != "none" && c.mode != "auto" && c.mode != "required")
      bad_request("'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                  "tool_choice");
  } else if (v->is_object()) {
    Fields f(*v, "tool_choice");
    if (f.str("type").value_or("") != "function") bad_request("'tool_choice.type' must be 'function'", "tool_choice.type");
    const json* fn = f.get("function");
    if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
      bad_request("'tool_choice.function.name' is required", "tool_choice.function.name");
    f.check_unknown();
    c.mode = "named";
    c.name = (*fn)["name"].get<std::string>();
    if (std::none_of(tools.begin(), tools.end(), [&](const ToolSpec& t) { return t.name == c.name; }))
      bad_request("'tool_choice' names the function '" + c.name + "', which is not in 'tools'", "tool_choice");
  } else {
    bad_request("'tool_choice' must be a string or an object", "tool_choice");
  }
  if (c.mode != "none" && c.mode != "auto" && tools.empty())
    bad_request("'tool_choice' '" + c.mode + "' needs 'tools'", "tool_choice");
  return c;
}

struct ThinkingOptions {
  bool thinking = false;
  std::string effort;  // as the chat format spells it
};

ThinkingOptions parse_thinking(Fields& f, ChatFormat fmt) {
  ThinkingOptions t;
  std::optional<std::string> effort = f.str("reasoning_effort");
  if (const json* k = f.get("chat_template_kwargs")) {
    if (!k->is_object()) bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    Fields g(*k, "chat_template_kwargs");
    if (auto b = g.boolean("thinking")) t.thinking = *b;
    if (auto b = g.boolean("enable_thinking")) t.thinking = *b;
    if (auto e = g.str("reasoning_effort")) effort = *e;
    g.check_unknown();
  }
  if (!effort) return t;
  const std::string& e = *effort;
  if (e == "none") {
    t.thinking = false;
    return t;
  }
  t.thinking = true;
  if (fmt == ChatFormat::kV4) {
    // V4 knows the default (high) and max (a fixed instruction prepended).
    if (e == "max") t.effort = "max";
    else if (e == "low" || e == "medium" || e == "high") t.effort = "";
    else bad_request("'reasoning_effort' must be none, low, medium, high or max for this model, got '" + e + "'", "reasoning_effort");
  } else {
    t.effort = e == "medium" ? "high" : e;  // V4.1: low (50), high (75), max (100) or "1".."100"; checked by the template
  }
  return t;
}

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
          const ChatParserOptions& po, std::optional<int> top_logprobs)
      : Job(st, std::move(r), "/v1/chat/completions", std::move(id), co, n), top_(top_logprobs) {
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
      cs.push_back(std::move(c));
    }
    body["choices"] = cs;
    return body;
  }
  std::optional<int64_t> reasoning_tokens() const override {
    int64_t r = 0;
    for (const Choice& c : choices_) r += c.reasoning_tokens;
    return r;
  }

  std::optional<int> top_;
  std::vector<Choice> choices_;
};

// The forced DSML block for tool_choice required / named.
StructuredOutputsParams forced_tools(ServerState& st, const std::vector<ToolSpec>& tools, const ToolChoice& choice,
                                     bool parallel, const DsmlSyntax& syn) {
  const std::optional<int32_t> marker = st.special_id(syn.marker);
  if (!marker) bad_request("tool_choice '" + choice.mode + "' needs the DSML token, which this tokenizer lacks", "tool_choice");
  std::vector<ToolSpec> use;
  for (const ToolSpec& t : tools)
    if (choice.mode != "named" || t.name == choice.name) use.push_back(t);
  StructuredOutputsParams so;
  try {
    so.grammar = dsml_tool_grammar(use, parallel && choice.mode != "named", syn, *marker);
  } catch (const Error& e) {
    bad_request(e.what(), "tools");
  }
  return so;
}

}  // namespace

void handle_chat(ServerState& st, const HttpRequest& req, std::shared_ptr<Responder> resp) {
  const double received = engine::now_seconds();
  json body = parse_body(req.body);
  Fields f(body, "");
  SamplingParams sp;
  sp.max_tokens = std::nullopt;  // chat: up to the model's length unless asked
  CommonOptions co = parse_common(f, sp, st.vocab_size);
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if (auto v = f.integer(k, 0, INT32_MAX)) sp.max_tokens = int(*v);
  std::optional<int> top;
  const bool want_lp = f.boolean("logprobs").value_or(false);
  if (auto v = f.integer("top_logprobs", 0, 20)) {
    if (!want_lp) bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    top = int(*v);
  }
  if (want_lp && !top) top = 0;
  sp.logprobs = top;
  std::vector<Message> messages = parse_messages(f.get("messages"));
  std::vector<ToolSpec> tools = parse_tools(f.get("tools"));
  const ToolChoice choice = parse_tool_choice(f.get("tool_choice"), tools);
  const bool parallel = f.boolean("parallel_tool_calls").value_or(true);
  const ThinkingOptions think = parse_thinking(f, st.chat_format);
  const bool add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  sp.structured_outputs = structured_outputs(f, st.vocab_size);
  std::string response_schema;
  if (body.contains("response_format") && body["response_format"].is_object() &&
      body["response_format"].value("type", "") == "json_schema" && sp.structured_outputs && sp.structured_outputs->json)
    response_schema = *sp.structured_outputs->json;
  f.check_unknown();
  if (!co.model.empty() && co.model != st.model_name && co.model != st.model_path)
    throw ApiError(404, "The model '" + co.model + "' does not exist; this server serves '" + st.model_name + "'", "model",
                   "model_not_found");

  const DsmlSyntax syn = st.chat_format == ChatFormat::kV41 ? DsmlSyntax::v41() : DsmlSyntax::v4();
  const bool use_tools = !tools.empty() && choice.mode != "none";
  if (use_tools || !response_schema.empty()) {
    // The template reads tools and the response schema from a system message.
    auto it = std::find_if(messages.begin(), messages.end(), [](const Message& m) { return m.role == "system" || m.role == "developer"; });
    if (it == messages.end()) {
      Message sys;
      sys.role = "system";
      it = messages.insert(messages.begin(), std::move(sys));
    }
    if (use_tools) {
      json arr = json::array();
      for (const ToolSpec& t : tools) {
        json fn = {{"name", t.name}};
        const json& orig = body["tools"][size_t(&t - tools.data())]["function"];
        if (orig.contains("description")) fn["description"] = orig["description"];
        if (!t.parameters.is_null()) fn["parameters"] = t.parameters;
        arr.push_back({{"type", "function"}, {"function", fn}});
      }
      it->tools_json = dump(arr);
    }
    it->response_format_json = response_schema;
  }
  if (use_tools && (choice.mode == "required" || choice.mode == "named")) {
    if (sp.structured_outputs) bad_request("tool_choice '" + choice.mode + "' cannot be combined with response_format", "tool_choice");
    sp.structured_outputs = forced_tools(st, tools, choice, parallel, syn);
  }
  if (sp.structured_outputs && think.thinking) {
    // Reasoning runs free; the constraint starts after </think>.
    if (auto end = st.special_id("</think>")) sp.structured_outputs->trigger_token_ids = {*end};
  }

  const engine::TextCodec* codec = st.loop->engine().codec();
  if (!codec) bad_request("this server has no tokenizer: use /v1/completions with token ids");
  std::string prompt;
  try {
    if (st.tokenizer) {
      if (st.chat_format == ChatFormat::kV41) {
        ChatOptionsV41 o;
        o.thinking = think.thinking;
        o.reasoning_effort = think.effort;
        o.add_generation_prompt = add_generation_prompt;
        prompt = st.tokenizer->apply_chat_template_v41(messages, o);
      } else {
        ChatOptions o;
        o.thinking = think.thinking;
        o.reasoning_effort = think.effort;
        o.add_generation_prompt = add_generation_prompt;
        prompt = st.tokenizer->apply_chat_template(messages, o);
      }
    } else {
      std::vector<ChatMessage> simple;
      for (const Message& m : messages) simple.push_back({m.role, m.content});
      prompt = codec->chat_prompt(simple, ChatTemplateOptions{add_generation_prompt, think.thinking});
    }
  } catch (const Error& e) {
    bad_request(std::string("'messages' cannot be rendered: ") + e.what(), "messages");
  }
  std::vector<int32_t> ids;
  try {
    ids = codec->encode(prompt);
    sp.skip_special_tokens = false;  // the parser needs </think> and the DSML markers; it removes them
    sp.validate(st.vocab_size);
    if (sp.structured_outputs && st.loop->engine().grammar()) st.loop->engine().grammar()->compile(*sp.structured_outputs);
  } catch (const Error& e) {
    bad_request(e.what());
  }

  ChatParserOptions po;
  po.thinking = think.thinking;
  po.parse_tools = use_tools;
  po.syntax = syn;
  if (st.tokenizer && st.tokenizer->eos_id()) po.eos_text = st.tokenizer->token_bytes(*st.tokenizer->eos_id());
  const std::string id = st.new_id("chatcmpl");
  po.new_call_id = [id, k = 0]() mutable { return "call_" + id.substr(9) + "_" + std::to_string(k++); };
  auto job = std::make_shared<ChatJob>(st, resp, id, co, sp.n, po, top);
  job->set_kv(req);
  std::vector<std::vector<int32_t>> prompts;
  prompts.push_back(std::move(ids));
  job->submit(std::move(prompts), sp, received);
}

}  // namespace deepinfer::server
