// DSML tool-call grammars (tool_calls.h).
#include "structured/tool_calls.h"

#include <algorithm>

#include "core/check.h"
#include "deepinfer/error.h"
#include "structured/vocab.h"

namespace deepinfer::structured {
namespace {
using json = nlohmann::ordered_json;

// A Lark string literal for `s` (quotes, backslashes, newlines escaped).
std::string lit(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o + "\"";
}

void check_name(const std::string& n, const std::string& what) {
  if (n.empty() || n.find_first_of("\"<>\n\r") != std::string::npos)
    DI_THROW(InvalidArgument, what, " '", n, "' cannot be written in DSML (empty, or holds a quote, '<', '>' or a newline)");
}

// A schema for Lark's %json. The templates write JSON values as Python's json.dumps does
// (", " and ": " separators; chat_dsv4.cpp py_dump), so a value that may be an array or an
// object gets flexible whitespace; scalars stay compact (as written: no room for padding).
std::string embed(json s) {
  if (s.is_boolean() && s.get<bool>()) s = json::object();
  if (!s.is_object()) return s.dump();
  bool nested = !s.contains("type") && !s.contains("enum") && !s.contains("const");
  if (s.contains("type")) {
    const json& t = s["type"];
    for (const json& x : t.is_array() ? t : json::array({t})) nested = nested || x == "array" || x == "object";
  }
  if (nested) s["x-guidance"] = {{"whitespace_flexible", true}};
  return s.dump();
}

// The Lark expression for a parameter's value, from `string="` on. The template writes a string
// value raw (string="true") and any other as JSON (string="false"), so a schema whose values may
// be strings offers the raw form: any text for type "string", the literals of a string enum or
// const; the JSON form (%json under the schema) for every other value.
std::string value_expr(const json& s) {
  const std::string raw = "\"true\\\">\" ", js = "\"false\\\">\" %json ";
  if (s.is_boolean()) return "(" + raw + "strval | " + js + embed(true) + ")";
  if (!s.is_object()) return js + embed(s);
  std::vector<std::string> strings;
  json others = json::array();
  auto literal_set = [&](const json& values) {
    for (const auto& v : values) {
      if (v.is_string()) strings.push_back(lit(v.get<std::string>()));
      else others.push_back(v);
    }
  };
  if (s.contains("enum") && s["enum"].is_array()) literal_set(s["enum"]);
  else if (s.contains("const")) literal_set(json::array({s["const"]}));
  else {
    const json* t = s.contains("type") ? &s["type"] : nullptr;
    bool str = false, other = false;
    if (!t) str = other = !s.contains("anyOf") && !s.contains("oneOf") && !s.contains("$ref") && !s.contains("allOf");
    else if (t->is_string()) (*t == "string" ? str : other) = true;
    else if (t->is_array())
      for (const auto& x : *t) (x == "string" ? str : other) = true;
    if (!str) return js + embed(s);
    return other ? "(" + raw + "strval | " + js + embed(s) + ")" : raw + "strval";
  }
  std::string alts;
  if (!strings.empty()) {
    alts = raw + "(";
    for (size_t i = 0; i < strings.size(); ++i) alts += (i ? " | " : "") + strings[i];
    alts += ")";
  }
  if (!others.empty()) alts += (alts.empty() ? "" : " | ") + js + embed(json{{"enum", others}});
  return "(" + alts + ")";
}

// One tool's `invoke_<id>` rule (and its parameter rules) appended to g.
void tool_rules(const DsmlTool& tool, size_t t, const DsmlFormat& f, const std::string& open, const std::string& close,
                std::string& g) {
  check_name(tool.name, "tool name");
  const std::string id = std::to_string(t);
  auto param = [&](const std::string& name_expr, const std::string& value_rule) {
    return open + lit(f.param + " name=\"") + " " + name_expr + " " + lit("\" string=\"") + " " + value_rule + " " +
           close + lit(f.param + ">") + " \"\\n\"";
  };
  std::string body;
  const json& ps = tool.parameters;
  if (ps.is_object() && ps.contains("properties") && ps["properties"].is_object()) {
    std::vector<std::string> required;
    if (ps.contains("required") && ps["required"].is_array())
      for (const auto& r : ps["required"])
        if (r.is_string()) required.push_back(r.get<std::string>());
    int k = 0;
    for (auto it = ps["properties"].begin(); it != ps["properties"].end(); ++it, ++k) {
      check_name(it.key(), "parameter name");
      const std::string rule = "p" + id + "_" + std::to_string(k);
      g += rule + ": " + param(lit(it.key()), value_expr(it.value())) + "\n";
      const bool req = std::find(required.begin(), required.end(), it.key()) != required.end();
      body += " " + rule + (req ? "" : "?");
    }
  } else {
    g += "anyparam" + id + ": " + param("/[^\"<>\\n]+/", "(\"true\\\">\" strval | \"false\\\">\" %json " + embed(true) + ")") + "\n";
    body = " anyparam" + id + "*";
  }
  g += "invoke_" + id + ": " + open + lit(f.invoke + " name=\"" + tool.name + "\">\n") + body + " \"\\n\"? " + close +
       lit(f.invoke + ">") + "\n";
}

DsmlTool parse_tool(const json& t, size_t i) {
  const std::string where = "so_args.tool_calls.tools[" + std::to_string(i) + "]";
  if (!t.is_object()) DI_THROW(InvalidArgument, where, " must be an object");
  const json* f = &t;
  if (t.contains("function")) {  // OpenAI's {"type": "function", "function": {...}}
    if (t.contains("type") && t["type"] != "function")
      DI_THROW(InvalidArgument, where, ".type must be \"function\", got ", t["type"].dump());
    f = &t["function"];
    if (!f->is_object()) DI_THROW(InvalidArgument, where, ".function must be an object");
  }
  if (!f->contains("name") || !(*f)["name"].is_string()) DI_THROW(InvalidArgument, where, " needs a string \"name\"");
  DsmlTool tool{(*f)["name"].get<std::string>(), f->contains("parameters") ? (*f)["parameters"] : json()};
  if (!tool.parameters.is_null() && !tool.parameters.is_object() && !tool.parameters.is_boolean())
    DI_THROW(InvalidArgument, where, ".parameters must be a JSON schema object");
  return tool;
}
}  // namespace

std::string dsml_tool_grammar(const std::vector<DsmlTool>& tools, bool parallel, const DsmlFormat& f, int32_t marker,
                              bool after_marker) {
  DI_CHECK(!tools.empty(), "dsml_tool_grammar needs a tool");
  const std::string m = "<[" + std::to_string(marker) + "]>";
  const std::string open = "\"<\" " + m + " ", close = "\"</\" " + m + " ";
  std::string g = "start: ";
  g += after_marker ? "" : "(\"\\n\\n\" | \"\\n\")? " + open;
  g += lit(f.calls + ">\n") + " invoke " + (parallel ? "(\"\\n\" invoke)* " : "") + "\"\\n\" " + close +
       lit(f.calls + ">") + "\n";
  g += "invoke: ";
  for (size_t t = 0; t < tools.size(); ++t) g += (t ? " | " : "") + std::string("invoke_") + std::to_string(t);
  g += "\n";
  // A string value: any text (it cannot spell the DSML marker, a special token, so the closing
  // tag is where the value ends).
  g += "strval: /[^\\x00]*/\n";
  for (size_t t = 0; t < tools.size(); ++t) tool_rules(tools[t], t, f, open, close, g);
  return g;
}

json expand_tool_calls(const json& a, const TokenVocabulary& vocab) {
  if (!a.is_object() || !a.contains("tool_calls")) return a;
  const json& tc = a["tool_calls"];
  if (!tc.is_object()) DI_THROW(InvalidArgument, "so_args.tool_calls must be an object");
  for (const char* k : {"regex", "json_schema", "json_object", "ebnf", "choice", "schema_type", "schema"})
    if (a.contains(k)) DI_THROW(InvalidArgument, "so_args has both tool_calls and ", k);
  for (auto it = tc.begin(); it != tc.end(); ++it)
    if (it.key() != "format" && it.key() != "tools" && it.key() != "mode" && it.key() != "parallel" && it.key() != "function")
      DI_THROW(InvalidArgument, "so_args.tool_calls.", it.key(), " is not a field (format, tools, mode, parallel, function)");
  const std::string fmt = tc.contains("format") && tc["format"].is_string() ? tc["format"].get<std::string>() : "";
  if (fmt != "v4" && fmt != "v41")
    DI_THROW(InvalidArgument, "so_args.tool_calls.format must be \"v4\" (DeepSeek-V4 DSML) or \"v41\" (V4.1), got ",
             tc.contains("format") ? tc["format"].dump() : std::string("nothing"));
  const DsmlFormat f = fmt == "v4" ? DsmlFormat::v4() : DsmlFormat::v41();
  const std::string mode = tc.contains("mode") && tc["mode"].is_string() ? tc["mode"].get<std::string>() : "required";
  if (mode != "required" && mode != "auto")
    DI_THROW(InvalidArgument, "so_args.tool_calls.mode must be \"required\" or \"auto\", got ", tc["mode"].dump());
  bool parallel = true;
  if (tc.contains("parallel")) {
    if (!tc["parallel"].is_boolean()) DI_THROW(InvalidArgument, "so_args.tool_calls.parallel must be a boolean");
    parallel = tc["parallel"].get<bool>();
  }
  if (!tc.contains("tools") || !tc["tools"].is_array() || tc["tools"].empty())
    DI_THROW(InvalidArgument, "so_args.tool_calls.tools must be a non-empty array of functions");
  std::vector<DsmlTool> tools;
  for (size_t i = 0; i < tc["tools"].size(); ++i) tools.push_back(parse_tool(tc["tools"][i], i));
  if (tc.contains("function")) {
    if (!tc["function"].is_string()) DI_THROW(InvalidArgument, "so_args.tool_calls.function must be a tool's name");
    const std::string name = tc["function"].get<std::string>();
    std::erase_if(tools, [&](const DsmlTool& t) { return t.name != name; });
    if (tools.empty()) DI_THROW(InvalidArgument, "so_args.tool_calls.function '", name, "' is not one of the tools");
    parallel = false;
  }
  const std::optional<int32_t> marker = vocab.terminal_named(f.marker);
  if (!marker)
    DI_THROW(InvalidArgument, "so_args.tool_calls needs the DSML token '", f.marker, "' as a grammar terminal, which this "
             "vocabulary lacks (TokenizerInfo::terminal_ids)");
  json out = a;
  out.erase("tool_calls");
  out["ebnf"] = dsml_tool_grammar(tools, parallel, f, *marker, mode == "auto");
  if (mode == "auto") {
    if (a.contains("trigger_token_ids") && !a["trigger_token_ids"].is_null())
      DI_THROW(InvalidArgument, "so_args.tool_calls mode \"auto\" sets its own trigger (the DSML token); "
                                "drop trigger_token_ids or use mode \"required\"");
    out["trigger_token_ids"] = json::array({*marker});
  }
  return out;
}

}  // namespace deepinfer::structured
