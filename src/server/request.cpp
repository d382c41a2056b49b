// Request bodies -> engine inputs (server/request.h). Moved out of the handlers so that the
// fuzz target can run every check without an engine; the rules are docs/SERVER.md's.
#include "server/request.h"

#include <algorithm>

#include "deepinfer/error.h"
#include "deepinfer/tokenizer.h"
#include "server/tool_grammar.h"

namespace deepinfer::server {

std::optional<int32_t> RequestContext::special_id(const std::string& text) const {
  if (!tokenizer) return std::nullopt;
  return tokenizer->token_to_id(text);
}

namespace {

void check_model(const RequestContext& st, const CommonOptions& co) {
  if (!co.model.empty() && co.model != st.model_name && co.model != st.model_path)
    throw ApiError(404, "The model '" + co.model + "' does not exist; this server serves '" + st.model_name + "'", "model",
                   "model_not_found");
}

// SamplingParams::validate's InvalidArgument (and any other typed error) as a 400.
void validate(const SamplingParams& sp, int64_t vocab) {
  try {
    sp.validate(vocab);
  } catch (const Error& e) {
    bad_request(e.what());
  }
}

struct Prompt {
  std::vector<int32_t> ids;
  std::string echo;  // the prompt's text for echo
};

std::vector<Prompt> parse_prompts(const RequestContext& st, const json* p, bool echo) {
  if (!p) bad_request("'prompt' is required", "prompt");
  auto from_text = [&](const std::string& t) {
    if (!st.encode) bad_request("this server has no tokenizer: give 'prompt' as token ids", "prompt");
    Prompt x;
    try {
      x.ids = st.encode(t);
    } catch (const Error& e) {
      bad_request(std::string("'prompt' cannot be tokenized: ") + e.what(), "prompt");
    }
    if (echo) x.echo = t;
    return x;
  };
  auto from_ids = [&](const json& a, const std::string& where) {
    Prompt x;
    for (const json& t : a) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= st.vocab_size)
        bad_request("'" + where + "' must hold token ids in [0, " + std::to_string(st.vocab_size) + ")", "prompt");
      x.ids.push_back(int32_t(t.get<int64_t>()));
    }
    if (echo && st.decode) x.echo = st.decode(x.ids);
    return x;
  };
  std::vector<Prompt> out;
  if (p->is_string()) {
    out.push_back(from_text(p->get<std::string>()));
  } else if (p->is_array() && !p->empty()) {
    const json& first = (*p)[0];
    if (first.is_number_integer()) {
      out.push_back(from_ids(*p, "prompt"));
    } else {
      for (size_t i = 0; i < p->size(); ++i) {
        const json& e = (*p)[i];
        const std::string where = "prompt[" + std::to_string(i) + "]";
        if (first.is_string() && e.is_string()) out.push_back(from_text(e.get<std::string>()));
        else if (first.is_array() && e.is_array() && !e.empty()) out.push_back(from_ids(e, where));
        else bad_request("'prompt' must be a string, an array of strings, token ids, or an array of token-id arrays", "prompt");
      }
    }
  } else {
    bad_request("'prompt' must be a non-empty string, array of strings, token ids, or array of token-id arrays", "prompt");
  }
  if (out.size() > 256) bad_request("'prompt' holds more than 256 prompts", "prompt");
  return out;
}

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

// The forced DSML block for tool_choice required / named.
StructuredOutputsParams forced_tools(const RequestContext& st, const std::vector<ToolSpec>& tools, const ToolChoice& choice,
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

CompletionRequest parse_completion_request(const RequestContext& st, const std::string& text) {
  json body = parse_body(text);
  Fields f(body, "");
  CompletionRequest r;
  SamplingParams& sp = r.params;
  sp.max_tokens = 16;  // OpenAI's default for completions
  r.common = parse_common(f, sp, st.vocab_size);
  if (const json* m = f.get("max_tokens")) {
    if (!m->is_number_integer() || m->get<int64_t>() < 0 || m->get<int64_t>() > INT32_MAX)
      bad_request("'max_tokens' must be a non-negative integer", "max_tokens");
    sp.max_tokens = int(m->get<int64_t>());
  } else if (body.contains("max_tokens")) {
    sp.max_tokens = std::nullopt;  // explicit null: up to the model's length
  }
  const bool echo = f.boolean("echo").value_or(false);
  if (auto v = f.integer("logprobs", 0, 1000)) r.logprobs = int(*v);
  sp.logprobs = r.logprobs;
  r.n = sp.n;
  // best_of (OpenAI, vLLM): best_of candidates per prompt, the n with the highest cumulative
  // logprob returned. The ranking needs the whole candidates, hence no streaming.
  if (auto b = f.integer("best_of", 1, 1024)) {
    if (*b < r.n)
      bad_request("'best_of' must be at least n (best_of=" + std::to_string(*b) + ", n=" + std::to_string(r.n) + ")",
                  "best_of");
    if (*b > r.n) {
      if (r.common.stream)
        bad_request("'best_of' greater than n cannot be streamed: the best n are known only when all " +
                        std::to_string(*b) + " candidates finish",
                    "best_of");
      sp.n = int(*b);
      if (!sp.logprobs) sp.logprobs = 0;  // the engine then sums each candidate's logprobs
    }
  }
  // suffix (insertion after the completion) needs a fill-in-the-middle prompt format the model
  // is served with; the V4 specs define none (docs/SERVER.md). Refused like vLLM, never dropped.
  if (auto s = f.str("suffix"); s && !s->empty())
    bad_request("'suffix' is not supported: DeepSeek-V4 has no documented fill-in-the-middle prompt format", "suffix");
  r.return_token_ids = f.boolean("return_token_ids").value_or(false);
  if (r.return_token_ids && r.common.stream) bad_request("'return_token_ids' is not supported with streaming", "return_token_ids");
  sp.structured_outputs = structured_outputs(f, st.vocab_size);
  std::vector<Prompt> prompts = parse_prompts(st, f.get("prompt"), echo);
  f.check_unknown();
  check_model(st, r.common);
  validate(sp, st.vocab_size);
  for (Prompt& p : prompts) {
    r.echo.push_back(std::move(p.echo));
    r.prompts.push_back(std::move(p.ids));
  }
  return r;
}

namespace {
// The chat prompt's text: the tokenizer's V4 or V4.1 template, or the codec's simple one.
std::string render_chat(const RequestContext& st, const std::vector<Message>& messages, const ThinkingOptions& think,
                        bool add_generation_prompt) {
  try {
    if (st.tokenizer && st.chat_format == ChatFormat::kV41) {
      ChatOptionsV41 o;
      o.thinking = think.thinking;
      o.reasoning_effort = think.effort;
      o.add_generation_prompt = add_generation_prompt;
      return st.tokenizer->apply_chat_template_v41(messages, o);
    }
    if (st.tokenizer) {
      ChatOptions o;
      o.thinking = think.thinking;
      o.reasoning_effort = think.effort;
      o.add_generation_prompt = add_generation_prompt;
      return st.tokenizer->apply_chat_template(messages, o);
    }
    std::vector<ChatMessage> simple;
    for (const Message& m : messages) simple.push_back({m.role, m.content});
    return st.chat_prompt(simple, ChatTemplateOptions{add_generation_prompt, think.thinking});
  } catch (const Error& e) {
    bad_request(std::string("'messages' cannot be rendered: ") + e.what(), "messages");
  }
}

// Tools and the response schema go into the prompt through a system message (inserted first
// when the conversation has none), as the templates read them.
void put_tools_in_prompt(std::vector<Message>& messages, const json& body, const std::vector<ToolSpec>& tools,
                         bool use_tools, const std::string& response_schema) {
  auto it = std::find_if(messages.begin(), messages.end(), [](const Message& m) { return m.role == "system" || m.role == "developer"; });
  if (it == messages.end()) {
    Message sys;
    sys.role = "system";
    it = messages.insert(messages.begin(), std::move(sys));
  }
  if (use_tools) {
    json arr = json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      json fn = {{"name", tools[i].name}};
      const json& orig = body["tools"][i]["function"];
      if (orig.contains("description")) fn["description"] = orig["description"];
      if (!tools[i].parameters.is_null()) fn["parameters"] = tools[i].parameters;
      arr.push_back({{"type", "function"}, {"function", fn}});
    }
    it->tools_json = dump(arr);
  }
  it->response_format_json = response_schema;
}
}  // namespace

ChatRequest parse_chat_request(const RequestContext& st, const std::string& text) {
  json body = parse_body(text);
  Fields f(body, "");
  ChatRequest r;
  SamplingParams& sp = r.params;
  sp.max_tokens = std::nullopt;  // chat: up to the model's length unless asked
  r.common = parse_common(f, sp, st.vocab_size);
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if (auto v = f.integer(k, 0, INT32_MAX)) sp.max_tokens = int(*v);
  const bool want_lp = f.boolean("logprobs").value_or(false);
  if (auto v = f.integer("top_logprobs", 0, 20)) {
    if (!want_lp) bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    r.top_logprobs = int(*v);
  }
  if (want_lp && !r.top_logprobs) r.top_logprobs = 0;
  sp.logprobs = r.top_logprobs;
  std::vector<Message> messages = parse_messages(f.get("messages"));
  std::vector<ToolSpec> tools = parse_tools(f.get("tools"));
  const ToolChoice choice = parse_tool_choice(f.get("tool_choice"), tools);
  const bool parallel = f.boolean("parallel_tool_calls").value_or(true);
  const ThinkingOptions think = parse_thinking(f, st.chat_format);
  const bool add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  r.return_token_ids = f.boolean("return_token_ids").value_or(false);
  if (r.return_token_ids && r.common.stream) bad_request("'return_token_ids' is not supported with streaming", "return_token_ids");
  sp.structured_outputs = structured_outputs(f, st.vocab_size);
  std::string response_schema;
  const json* rf = body.contains("response_format") ? &body["response_format"] : nullptr;
  if (rf && rf->is_object() && rf->contains("type") && (*rf)["type"] == "json_schema" && sp.structured_outputs &&
      sp.structured_outputs->json)
    response_schema = *sp.structured_outputs->json;
  f.check_unknown();
  check_model(st, r.common);

  r.syntax = st.chat_format == ChatFormat::kV41 ? DsmlSyntax::v41() : DsmlSyntax::v4();
  r.parse_tools = !tools.empty() && choice.mode != "none";
  if (r.parse_tools || !response_schema.empty()) put_tools_in_prompt(messages, body, tools, r.parse_tools, response_schema);
  if (r.parse_tools && (choice.mode == "required" || choice.mode == "named")) {
    if (sp.structured_outputs) bad_request("tool_choice '" + choice.mode + "' cannot be combined with response_format", "tool_choice");
    sp.structured_outputs = forced_tools(st, tools, choice, parallel, r.syntax);
  }
  if (sp.structured_outputs && think.thinking) {
    // Reasoning runs free; the constraint starts after </think>.
    if (auto end = st.special_id("</think>")) sp.structured_outputs->trigger_token_ids = {*end};
  }
  if (!st.encode) bad_request("this server has no tokenizer: use /v1/completions with token ids");
  const std::string prompt = render_chat(st, messages, think, add_generation_prompt);
  try {
    r.prompt = st.encode(prompt);
  } catch (const Error& e) {
    bad_request(std::string("'messages' cannot be tokenized: ") + e.what(), "messages");
  }
  sp.skip_special_tokens = false;  // the parser needs </think> and the DSML markers; it removes them
  validate(sp, st.vocab_size);
  r.thinking = think.thinking;
  return r;
}

}  // namespace deepinfer::server
