#include "server/tool_grammar.h"

#include <algorithm>

#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::server {
namespace {
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

// The Lark expression for a parameter's value, from `string="` on. The template writes a string
// value raw (string="true") and any other as JSON (string="false"), so a schema whose values may
// be strings offers the raw form: any text for type "string", the literals of a string enum or
// const; the JSON form (%json under the schema) for every other value.
std::string value_expr(const nlohmann::json& s) {
  const std::string raw = "\"true\\\">\" ", js = "\"false\\\">\" %json ";
  if (s.is_boolean()) return "(" + raw + "strval | " + js + "{})";
  if (!s.is_object()) return js + s.dump();
  std::vector<std::string> strings;
  nlohmann::json others = nlohmann::json::array();
  auto literal_set = [&](const nlohmann::json& values) {
    for (const auto& v : values) {
      if (v.is_string()) strings.push_back(lit(v.get<std::string>()));
      else others.push_back(v);
    }
  };
  if (s.contains("enum") && s["enum"].is_array()) literal_set(s["enum"]);
  else if (s.contains("const")) literal_set(nlohmann::json::array({s["const"]}));
  else {
    const nlohmann::json* t = s.contains("type") ? &s["type"] : nullptr;
    bool str = false, other = false;
    if (!t) str = other = !s.contains("anyOf") && !s.contains("oneOf") && !s.contains("$ref") && !s.contains("allOf");
    else if (t->is_string()) (*t == "string" ? str : other) = true;
    else if (t->is_array())
      for (const auto& x : *t) (x == "string" ? str : other) = true;
    if (!str) return js + s.dump();
    return other ? "(" + raw + "strval | " + js + s.dump() + ")" : raw + "strval";
  }
  std::string alts;
  if (!strings.empty()) {
    alts = raw + "(";
    for (size_t i = 0; i < strings.size(); ++i) alts += (i ? " | " : "") + strings[i];
    alts += ")";
  }
  if (!others.empty()) alts += (alts.empty() ? "" : " | ") + js + nlohmann::json{{"enum", others}}.dump();
  return "(" + alts + ")";
}
}  // namespace

std::string dsml_tool_grammar(const std::vector<ToolSpec>& tools, bool parallel, const DsmlSyntax& syn, int32_t marker) {
  DI_CHECK(!tools.empty(), "dsml_tool_grammar needs a tool");
  const std::string m = "<[" + std::to_string(marker) + "]>";
  const std::string open = "\"<\" " + m + " ", close = "\"</\" " + m + " ";
  std::string g;
  g += "start: (\"\\n\\n\" | \"\\n\")? " + open + lit(syn.calls + ">\n") + " invoke " +
       (parallel ? "(\"\\n\" invoke)* " : "") + "\"\\n\" " + close + lit(syn.calls + ">") + "\n";
  g += "invoke: ";
  for (size_t t = 0; t < tools.size(); ++t) g += (t ? " | " : "") + std::string("invoke_") + std::to_string(t);
  g += "\n";
  // A string value: any text (it cannot spell the DSML marker, a special token, so the closing
  // tag is where the value ends).
  g += "strval: /[^\\x00]*/\n";
  for (size_t t = 0; t < tools.size(); ++t) {
    const ToolSpec& tool = tools[t];
    check_name(tool.name, "tool name");
    const std::string id = std::to_string(t);
    // `name_expr`: a Lark expression for the parameter's name.
    auto param = [&](const std::string& name_expr, const std::string& value_rule) {
      return open + lit(syn.param + " name=\"") + " " + name_expr + " " + lit("\" string=\"") + " " + value_rule + " " +
             close + lit(syn.param + ">") + " \"\\n\"";
    };
    std::string body;
    const nlohmann::json& ps = tool.parameters;
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
      g += "anyparam" + id + ": " +  param("/[^\"<>\\n]+/", "(\"true\\\">\" strval | \"false\\\">\" %json {})") + "\n";
      body = " anyparam" + id + "*";
    }
    g += "invoke_" + id + ": " + open + lit(syn.invoke + " name=\"" + tool.name + "\">\n") + body + " \"\\n\"? " + close +
         lit(syn.invoke + ">") + "\n";
  }
  return g;
}

}  // namespace deepinfer::server
