#include "server/protocol.h"

#include <cmath>

#include "core/json.h"
#include "core/strings.h"

namespace deepinfer::server {
namespace {
const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    case json::value_t::number_float: return "number";
    default: return "integer";
  }
}
std::string num_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
}  // namespace

void bad_request(const std::string& message, const std::string& param) { throw ApiError(400, message, param); }

std::string error_body(int status, const std::string& message, const std::string& param, const std::string& code) {
  const char* type = status == 404   ? "not_found_error"
                     : status == 503 ? "service_unavailable"
                     : status == 429 ? "rate_limit_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  json e = {{"message", escape_invalid_utf8(message)}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return dump(json{{"error", e}});
}

std::string dump(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

json parse_body(const std::string& body) {
  json j;
  std::string why;
  if (body.empty()) bad_request("the request body is empty; expected a JSON object");
  if (!parse_json_bounded(body, j, &why)) bad_request("the request body is not valid JSON: " + why);
  if (!j.is_object()) bad_request(std::string("the request body must be a JSON object, got ") + type_name(j));
  return j;
}

Fields::Fields(const json& object, std::string where) : obj_(object), where_(std::move(where)) {}

bool Fields::has(const char* key) const {
  auto it = obj_.find(key);
  return it != obj_.end() && !it->is_null();
}

const json* Fields::get(const char* key) {
  read_.insert(key);
  auto it = obj_.find(key);
  return it == obj_.end() || it->is_null() ? nullptr : &*it;
}

std::optional<std::string> Fields::str(const char* key) {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_request("'" + name(key) + "' must be a string, got " + type_name(*v), name(key));
  return v->get<std::string>();
}

std::optional<bool> Fields::boolean(const char* key) {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_request("'" + name(key) + "' must be a boolean, got " + type_name(*v), name(key));
  return v->get<bool>();
}

std::optional<int64_t> Fields::integer(const char* key, int64_t lo, int64_t hi) {
  const json* v = get(key);
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) x = INT64_MAX;
    else x = v->get<int64_t>();
  } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() && std::fabs(v->get<double>()) < 9e15) {
    x = int64_t(v->get<double>());  // 5.0 is an integer in JSON Schema's sense
  } else {
    bad_request("'" + name(key) + "' must be an integer, got " + type_name(*v), name(key));
  }
  if (x < lo || x > hi)
    bad_request("'" + name(key) + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                    std::to_string(x),
                name(key));
  return x;
}

std::optional<double> Fields::number(const char* key, double lo, double hi) {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_request("'" + name(key) + "' must be a number, got " + type_name(*v), name(key));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi))
    bad_request("'" + name(key) + "' must be in [" + num_text(lo) + ", " + num_text(hi) + "], got " + num_text(x), name(key));
  return x;
}

void Fields::check_unknown() const {
  for (auto it = obj_.begin(); it != obj_.end(); ++it)
    if (!read_.count(it.key())) bad_request("Unrecognized request argument supplied: " + name(it.key().c_str()), name(it.key().c_str()));
}

CommonOptions parse_common(Fields& f, SamplingParams& sp, int64_t vocab) {
  CommonOptions c;
  c.model = f.str("model").value_or("");
  c.stream = f.boolean("stream").value_or(false);
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object()) bad_request("'stream_options' must be an object", "stream_options");
    if (!c.stream) bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    Fields s(*so, "stream_options");
    c.include_usage = s.boolean("include_usage").value_or(false);
    c.continuous_usage = s.boolean("continuous_usage_stats").value_or(false);
    s.check_unknown();
  }
  if (auto v = f.integer("n", 1, 1024)) sp.n = int(*v);
  if (auto v = f.number("temperature", 0, 1e6)) sp.temperature = float(*v);
  if (auto v = f.number("top_p", 0, 1)) {
    if (*v <= 0) bad_request("'top_p' must be in (0, 1], got 0", "top_p");
    sp.top_p = float(*v);
  }
  if (auto v = f.integer("top_k", -1, INT32_MAX)) sp.top_k = int(*v);
  if (auto v = f.number("min_p", 0, 1)) sp.min_p = float(*v);
  if (auto v = f.number("presence_penalty", -2, 2)) sp.presence_penalty = float(*v);
  if (auto v = f.number("frequency_penalty", -2, 2)) sp.frequency_penalty = float(*v);
  if (auto v = f.number("repetition_penalty", 1e-6, 1e6)) sp.repetition_penalty = float(*v);
  if (auto v = f.integer("min_tokens", 0, INT32_MAX)) sp.min_tokens = int(*v);
  if (const json* s = f.get("seed")) {
    if (!s->is_number_integer()) bad_request("'seed' must be an integer", "seed");
    sp.seed = s->is_number_unsigned() ? s->get<uint64_t>() : uint64_t(s->get<int64_t>());
  }
  if (const json* s = f.get("stop")) {
    if (s->is_string()) {
      sp.stop = {s->get<std::string>()};
    } else if (s->is_array()) {
      for (size_t i = 0; i < s->size(); ++i) {
        if (!(*s)[i].is_string()) bad_request("'stop' must be a string or an array of strings", "stop");
        sp.stop.push_back((*s)[i].get<std::string>());
      }
    } else {
      bad_request(std::string("'stop' must be a string or an array of strings, got ") + type_name(*s), "stop");
    }
    for (const std::string& x : sp.stop)
      if (x.empty()) bad_request("'stop' strings must not be empty", "stop");
  }
  if (const json* s = f.get("stop_token_ids")) {
    if (!s->is_array()) bad_request("'stop_token_ids' must be an array of token ids", "stop_token_ids");
    for (const json& t : *s) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
        bad_request("'stop_token_ids' entries must be token ids in [0, " + std::to_string(vocab) + ")", "stop_token_ids");
      sp.stop_token_ids.push_back(int32_t(t.get<int64_t>()));
    }
  }
  if (const json* b = f.get("logit_bias")) {
    if (!b->is_object()) bad_request("'logit_bias' must be an object mapping token ids to biases", "logit_bias");
    for (auto it = b->begin(); it != b->end(); ++it) {
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(it.key(), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != it.key().size() || id < 0 || id >= vocab)
        bad_request("'logit_bias' key '" + it.key() + "' is not a token id in [0, " + std::to_string(vocab) + ")", "logit_bias");
      if (!it.value().is_number() || !(it.value().get<double>() >= -100 && it.value().get<double>() <= 100))
        bad_request("'logit_bias' values must be numbers in [-100, 100]", "logit_bias");
      sp.logit_bias.emplace_back(int32_t(id), float(it.value().get<double>()));
    }
  }
  if (auto v = f.boolean("ignore_eos")) sp.ignore_eos = *v;
  if (auto v = f.boolean("skip_special_tokens")) sp.skip_special_tokens = *v;
  if (auto v = f.boolean("include_stop_str_in_output")) sp.include_stop_str_in_output = *v;
  f.str("user");  // accepted, not used
  return c;
}

namespace {
std::string schema_text(const json& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() || v.is_boolean()) return dump(v);
  bad_request("'" + where + "' must be a JSON schema (an object)", where);
}

StructuredOutputsParams parse_so_args(const json& v, const std::string& where, int64_t vocab) {
  if (!v.is_object()) bad_request("'" + where + "' must be an object", where);
  Fields f(v, where);
  StructuredOutputsParams s;
  std::optional<std::string> schema_type = f.str("schema_type");
  const json* schema = f.get("schema");
  if (schema_type.has_value() != (schema != nullptr))
    bad_request("'" + where + ".schema_type' and '" + where + ".schema' go together", where);
  if (schema_type) {
    if (*schema_type == "json") s.json = schema_text(*schema, where + ".schema");
    else if (*schema_type == "regex" && schema->is_string()) s.regex = schema->get<std::string>();
    else if (*schema_type == "ebnf" && schema->is_string()) s.grammar = schema->get<std::string>();
    else bad_request("'" + where + ".schema_type' must be json, regex or ebnf (with a schema of that kind)", where);
  }
  for (const char* k : {"json", "json_schema"})
    if (const json* j = f.get(k)) {
      if (s.json) bad_request("'" + where + "' names a JSON schema twice", where);
      s.json = schema_text(*j, f.name(k));
    }
  if (auto r = f.str("regex")) s.regex = *r;
  for (const char* k : {"grammar", "ebnf"})
    if (auto g = f.str(k)) {
      if (s.grammar) bad_request("'" + where + "' names a grammar twice", where);
      s.grammar = *g;
    }
  if (const json* c = f.get("choice")) {
    if (!c->is_array() || c->empty()) bad_request("'" + f.name("choice") + "' must be a non-empty array of strings", f.name("choice"));
    s.choice.emplace();
    for (const json& x : *c) {
      if (!x.is_string()) bad_request("'" + f.name("choice") + "' must be a non-empty array of strings", f.name("choice"));
      s.choice->push_back(x.get<std::string>());
    }
  }
  if (auto b = f.boolean("json_object")) s.json_object = *b;
  if (const json* t = f.get("trigger_token_ids")) {
    if (!t->is_array()) bad_request("'" + f.name("trigger_token_ids") + "' must be an array of token ids", f.name("trigger_token_ids"));
    for (const json& x : *t) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)
        bad_request("'" + f.name("trigger_token_ids") + "' entries must be token ids in [0, " + std::to_string(vocab) + ")",
                    f.name("trigger_token_ids"));
      s.trigger_token_ids.push_back(int32_t(x.get<int64_t>()));
    }
  }
  if (auto b = f.integer("bound_token_id", 0, vocab - 1)) {
    if (s.trigger_token_ids.empty())
      bad_request("'" + f.name("bound_token_id") + "' needs a non-empty trigger_token_ids", f.name("bound_token_id"));
    s.bound_token_id = int32_t(*b);
  }
  f.check_unknown();
  if (s.num_set() != 1)
    bad_request("'" + where + "' needs exactly one of json, regex, choice, grammar, json_object (got " +
                    std::to_string(s.num_set()) + ")",
                where);
  return s;
}

std::optional<StructuredOutputsParams> parse_response_format(const json& v) {
  if (!v.is_object()) bad_request("'response_format' must be an object", "response_format");
  Fields f(v, "response_format");
  const std::string type = f.str("type").value_or("");
  std::optional<StructuredOutputsParams> s;
  if (type == "text") {
  } else if (type == "json_object") {
    s.emplace().json_object = true;
  } else if (type == "json_schema") {
    const json* js = f.get("json_schema");
    if (!js || !js->is_object())
      bad_request("'response_format.json_schema' must be an object with a 'schema'", "response_format.json_schema");
    Fields g(*js, "response_format.json_schema");
    g.str("name");
    g.str("description");
    g.boolean("strict");
    const json* schema = g.get("schema");
    g.check_unknown();
    s.emplace().json = schema ? schema_text(*schema, "response_format.json_schema.schema") : std::string("{}");
  } else {
    bad_request("'response_format.type' must be text, json_object or json_schema, got '" + type + "'", "response_format.type");
  }
  f.check_unknown();
  return s;
}
}  // namespace

std::optional<StructuredOutputsParams> structured_outputs(Fields& f, int64_t vocab) {
  std::optional<StructuredOutputsParams> out;
  int given = 0;
  if (const json* r = f.get("response_format")) {
    out = parse_response_format(*r);
    given += out.has_value();
  }
  for (const char* k : {"so_args", "structured_outputs"})
    if (const json* s = f.get(k)) {
      out = parse_so_args(*s, k, vocab);
      ++given;
    }
  if (given > 1) bad_request("give at most one of response_format, so_args, structured_outputs", "response_format");
  return out;
}

json usage_json(int64_t prompt, int64_t completion, int64_t cached, std::optional<int64_t> reasoning) {
  json u = {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  if (reasoning) u["completion_tokens_details"] = {{"reasoning_tokens", *reasoning}};
  return u;
}

namespace {
// The engine's field, whichever shape it lands in (optional or plain count); 0 until it exists.
template <class R>
int64_t cached_of(const R& o) {
  if constexpr (requires { o.num_cached_tokens.value_or(0); }) return int64_t(o.num_cached_tokens.value_or(0));
  else if constexpr (requires { int64_t(o.num_cached_tokens); }) return int64_t(o.num_cached_tokens);
  else return 0;
}
}  // namespace

int64_t cached_prompt_tokens(const RequestOutput& o) { return cached_of(o); }

}  // namespace deepinfer::server
