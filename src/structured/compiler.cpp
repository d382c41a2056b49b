// so_args -> CompiledGrammar, and the compile cache.
#include <algorithm>
#include <chrono>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/json.h"
#include "structured/compiled.h"
#include "structured/ebnf.h"
#include "structured/json_schema.h"
#include "structured/regex.h"
#include "structured/tool_calls.h"
#include "structured/vocab.h"

namespace deepinfer::structured {
namespace {

using json = nlohmann::ordered_json;

// JSON nesting allowed in so_args (and in a json_schema given as a string): every walk over
// the parsed value (serialising it, indexing $id, lowering enum values) recurses per level, so
// the text is measured first, without recursion.
constexpr int kMaxJsonDepth = kMaxSoArgsDepth;

// Byte offset where `text` first nests arrays/objects deeper than `limit`, or -1.
int64_t too_deep_at(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return static_cast<int64_t>(i);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return -1;
}

// Throws `E` when `text` nests arrays/objects deeper than kMaxJsonDepth (strings skipped).
template <class E>
void check_json_depth(std::string_view text, const char* what) {
  if (const int64_t at = too_deep_at(text, kMaxJsonDepth); at >= 0)
    DI_THROW(E, what, " nests deeper than ", kMaxJsonDepth, " levels (at byte ", at, ")");
}

// The message with every byte that is not part of valid UTF-8 written as \xNN (error text
// quotes user input, sometimes one byte of a multi-byte character); a message over 2000 bytes
// keeps its first and last 1000 (the reason is often at the end).
std::string utf8_safe(std::string_view m) {
  if (m.size() > 2000) return utf8_safe(m.substr(0, 1000)) + " ... " + utf8_safe(m.substr(m.size() - 1000));
  std::string out;
  const size_t n = m.size();
  for (size_t i = 0; i < n;) {
    const auto c = static_cast<unsigned char>(m[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= m.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(m[i + k]) & 0xC0) == 0x80;
    if (ok && len > 1) {  // no overlongs, surrogates or code points past U+10FFFF
      uint32_t cp = c & (0x7F >> len);
      for (size_t k = 1; k < len; ++k) cp = cp << 6 | (static_cast<unsigned char>(m[i + k]) & 0x3F);
      ok = cp >= (len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u) && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
    }
    if (ok) {
      out.append(m.substr(i, len));
      i += len;
    } else {
      static const char* kHex = "0123456789ABCDEF";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
    }
  }
  return out;
}

// so_args (or a schema given as JSON text) -> JSON. Syntax errors are SyntaxErr; a number past
// double's range (1e999: nlohmann's out_of_range, which used to escape untyped) is a
// GrammarError naming the field, e.g. "json_schema: field 'minimum': the number 1e999 ...".
template <typename Json, typename SyntaxErr = InvalidArgument>
Json parse_so_args_text(std::string_view text, const char* what) {
  Json out;
  std::string why;
  if (parse_json_bounded(text, out, &why, kMaxJsonDepth)) return out;
  std::string where;
  if (json_number_out_of_range(text, &where)) DI_THROW(GrammarError, what, ": ", where);
  DI_THROW(SyntaxErr, what, " is not valid JSON: ", utf8_safe(why));
}

json parse_so_args(std::string_view text) {
  check_json_depth<InvalidArgument>(text, "so_args");
  return parse_so_args_text<json>(text, "so_args");
}

JsonGrammarOptions json_options(const json& a, std::chrono::steady_clock::time_point deadline) {
  JsonGrammarOptions o;
  o.deadline = deadline;
  if (a.contains("whitespace")) {
    const json& w = a["whitespace"];
    if (w == "flexible") o.flexible_whitespace = true;
    else if (w != "compact") DI_THROW(InvalidArgument, "so_args.whitespace must be \"compact\" or \"flexible\"");
  }
  if (a.contains("max_whitespace")) {
    if (!a["max_whitespace"].is_number_integer() || a["max_whitespace"].get<int64_t>() < 0 || a["max_whitespace"].get<int64_t>() > 64)
      DI_THROW(InvalidArgument, "so_args.max_whitespace must be an integer in [0, 64]");
    o.max_whitespace = a["max_whitespace"].get<int32_t>();
  }
  if (a.contains("format_assertion")) {
    if (!a["format_assertion"].is_boolean()) DI_THROW(InvalidArgument, "so_args.format_assertion must be a boolean");
    o.format_assertion = a["format_assertion"].get<bool>();
  }
  return o;
}

Grammar lower_json(const json& a, std::chrono::steady_clock::time_point deadline) {
  if (a.contains("json_schema")) {
    json schema = a["json_schema"];
    if (schema.is_string()) {
      check_json_depth<GrammarError>(schema.get<std::string>(), "json_schema");
      schema = parse_so_args_text<json, GrammarError>(schema.get<std::string>(), "json_schema");
    }
    return json_schema_to_grammar(schema, json_options(a, deadline));
  }
  if (a["json_object"] != true) DI_THROW(InvalidArgument, "so_args.json_object must be true");
  return json_object_grammar(json_options(a, deadline));
}

}  // namespace

namespace {
// DeepInfer's form {"schema_type": "json" | "regex" | "ebnf", "schema": ...} as the key it
// stands for (json -> json_schema: a schema object or its JSON text).
void normalise_schema_type(json& a) {
  if (a.contains("bound_token_ids"))
    DI_THROW(InvalidArgument, "so_args.bound_token_ids is not supported; use bound_token_id (one non-negative integer)");
  if (!a.contains("schema_type")) {
    if (a.contains("schema")) DI_THROW(InvalidArgument, "so_args.schema needs so_args.schema_type");
    return;
  }
  const json& t = a["schema_type"];
  if (!a.contains("schema")) DI_THROW(InvalidArgument, "so_args.schema_type needs so_args.schema");
  const char* key = t == "json" ? "json_schema" : t == "regex" ? "regex" : t == "ebnf" ? "ebnf" : nullptr;
  if (!key) DI_THROW(InvalidArgument, "so_args.schema_type must be \"json\", \"regex\" or \"ebnf\", got ", t.dump());
  if (a.contains(key)) DI_THROW(InvalidArgument, "so_args has both schema_type and ", key);
  a[key] = a["schema"];
  a.erase("schema");
  a.erase("schema_type");
}

Grammar lower_so_args_unsafe(json a, std::chrono::steady_clock::time_point deadline) {
  if (!a.is_object()) DI_THROW(InvalidArgument, "so_args must be a JSON object");
  normalise_schema_type(a);
  int kinds = 0;
  for (const char* k : {"regex", "json_schema", "json_object", "ebnf", "choice"}) kinds += a.contains(k) ? 1 : 0;
  if (kinds != 1)
    DI_THROW(InvalidArgument, "so_args needs exactly one of regex, json_schema, json_object, ebnf, choice, "
                              "tool_calls (or schema_type with schema)");
  if (a.contains("regex")) {
    if (!a["regex"].is_string()) DI_THROW(InvalidArgument, "so_args.regex must be a string");
    GrammarBuilder b;
    RegexOptions o;
    ExprId e = regex_to_expr(b, a["regex"].get<std::string>(), o);
    RuleId root = b.declare_rule("root");
    b.define_rule(root, e);
    return std::move(b).finish(root);
  }
  if (a.contains("ebnf")) {
    if (!a["ebnf"].is_string()) DI_THROW(InvalidArgument, "so_args.ebnf must be a string");
    return ebnf_to_grammar(a["ebnf"].get<std::string>(), json_options(a, deadline));  // for Lark's %json
  }
  if (a.contains("choice")) {
    if (!a["choice"].is_array()) DI_THROW(InvalidArgument, "so_args.choice must be an array of strings");
    GrammarBuilder b;
    std::vector<ExprId> alts;
    for (const auto& c : a["choice"]) {
      if (!c.is_string()) DI_THROW(InvalidArgument, "so_args.choice must be an array of strings");
      alts.push_back(b.literal(c.get<std::string>()));
    }
    RuleId root = b.declare_rule("root");
    b.define_rule(root, b.alt(std::move(alts)));
    return std::move(b).finish(root);
  }
  return lower_json(a, deadline);
}
}  // namespace

namespace {
// trigger_spec and lower_so_args on so_args parsed once (compile_uncached parses it anyway).
TriggerSpec trigger_spec_of(const json& a, int32_t vocab_size) {
  TriggerSpec t;
  if (!a.is_object()) return t;
  auto token = [&](const json& v, const char* what) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab_size)
      DI_THROW(InvalidArgument, "so_args.", what, " must hold token ids in [0, ", vocab_size, "), got ", v.dump());
    return static_cast<int32_t>(v.get<int64_t>());
  };
  if (a.contains("trigger_token_ids") && !a["trigger_token_ids"].is_null()) {
    const json& tr = a["trigger_token_ids"];
    if (!tr.is_array()) DI_THROW(InvalidArgument, "so_args.trigger_token_ids must be a list of token ids");
    for (const auto& v : tr) t.tokens.push_back(token(v, "trigger_token_ids"));
  }
  if (a.contains("bound_token_id") && !a["bound_token_id"].is_null()) {
    t.bound = token(a["bound_token_id"], "bound_token_id");
    if (t.tokens.empty()) DI_THROW(InvalidArgument, "so_args.bound_token_id requires a non-empty trigger_token_ids");
  }
  // KMP failure function: failure[i] = longest proper border of tokens[0..i].
  t.failure.assign(t.tokens.size(), 0);
  for (size_t i = 1, k = 0; i < t.tokens.size(); ++i) {
    while (k > 0 && t.tokens[i] != t.tokens[k]) k = t.failure[k - 1];
    if (t.tokens[i] == t.tokens[k]) ++k;
    t.failure[i] = static_cast<int32_t>(k);
  }
  return t;
}
}  // namespace

int json_nesting_depth(std::string_view text) {
  int depth = 0, most = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      most = std::max(most, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return most;
}

namespace {
// Errors re-thrown with UTF-8-safe text: they end up in JSON responses and logs.
Grammar lower_so_args_parsed(json a, double time_limit_ms) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(std::min(time_limit_ms, 1e12) * 1000));
  try {
    return lower_so_args_unsafe(std::move(a), deadline);
  } catch (const GrammarError& e) {
    throw GrammarError(utf8_safe(e.what()));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(utf8_safe(e.what()));
  }
}

}  // namespace

TriggerSpec trigger_spec(std::string_view so_args_json, int32_t vocab_size) {
  return trigger_spec_of(parse_so_args(so_args_json), vocab_size);
}

Grammar lower_so_args(std::string_view text, double time_limit_ms) {
  json a;
  try {
    a = parse_so_args(text);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(utf8_safe(e.what()));
  }
  return lower_so_args_parsed(std::move(a), time_limit_ms);
}

std::string so_args_to_grammar_text(std::string_view so_args_json) { return lower_so_args(so_args_json).to_string(); }

std::string CompiledGrammar::grammar_text() const { return impl_->grammar.to_string(); }
int64_t CompiledGrammar::num_states() const { return static_cast<int64_t>(impl_->pda.num_states()); }
double CompiledGrammar::compile_ms() const { return impl_->compile_ms; }
MaskPrecomputeResult CompiledGrammar::precompute_masks(const MaskPrecompute& opts, const std::atomic<bool>* cancel) const {
  return impl_->precompute_masks(opts, cancel);
}
int64_t CompiledGrammar::mask_cache_bytes() const { return impl_->mask_cache_bytes(); }
int64_t CompiledGrammar::release_mask_caches() const { return impl_->release_mask_caches(); }

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocab, CompilerOptions options)
    : vocab_(std::move(vocab)), options_(options) {
  DI_CHECK(vocab_ != nullptr, "null vocabulary");
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile_uncached(std::string_view so_args_json) const {
  auto t0 = std::chrono::steady_clock::now();
  auto impl = std::make_shared<CompiledGrammarImpl>();
  // Forms that need the vocabulary (tool_calls: the DSML token's id) become plain so_args first.
  // Parsed once here for the lowering and the trigger (each parse was ~2% of a compile).
  std::string expanded;
  json a;
  try {
    a = parse_so_args(so_args_json);
    if (a.is_object() && a.contains("tool_calls")) {
      expanded = expand_tool_calls(a, *vocab_).dump();
      a = parse_so_args(expanded);
    }
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(utf8_safe(e.what()));
  }
  impl->grammar = lower_so_args_parsed(a, options_.time_limit_ms);
  for (int32_t id : impl->grammar.special_terminals)
    if (!vocab_->is_terminal(id))
      DI_THROW(GrammarError, "the grammar names the special token <[", id, "]>, which this vocabulary does not offer as a "
               "grammar terminal (", vocab_->terminal_ids().size(), " terminals: TokenizerInfo::terminal_ids)");
  AutomatonLimits lim;
  // The automaton gets what the lowering left of the budget.
  lim.time_limit_ms = std::max(1.0, options_.time_limit_ms -
                                        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  try {
    impl->pda = build_pda(impl->grammar, lim);
  } catch (const GrammarError& e) {
    throw GrammarError(utf8_safe(e.what()));
  }
  impl->vocab = vocab_;
  impl->trigger = trigger_spec_of(a, vocab_->vocab_size());
  impl->compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return std::make_shared<const CompiledGrammar>(std::move(impl));
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(std::string_view so_args_json) {
  // Canonical key: re-serialised JSON (whitespace and escapes normalised, key order kept).
  std::string key;
  check_json_depth<InvalidArgument>(so_args_json, "so_args");
  key = parse_so_args_text<nlohmann::ordered_json>(so_args_json, "so_args").dump();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
  }
  auto g = compile_uncached(so_args_json);
  std::lock_guard<std::mutex> lock(mu_);
  if (cache_.emplace(key, g).second) {
    cache_order_.push_back(key);
    while (cache_order_.size() > options_.cache_capacity) {
      cache_.erase(cache_order_.front());
      cache_order_.erase(cache_order_.begin());
    }
  }
  return g;
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::find_cached(std::string_view so_args_json) {
  if (json_nesting_depth(so_args_json) > kMaxJsonDepth) return nullptr;
  std::string key;
  try {
    key = nlohmann::ordered_json::parse(so_args_json).dump();
  } catch (const nlohmann::json::exception&) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  return it == cache_.end() ? nullptr : it->second;
}

}  // namespace deepinfer::structured
