// DSML tool-call blocks (DeepSeek-V4 `<｜DSML｜tool_calls>` and V4.1's spaced tags) as grammars:
// the text the chat template renders for an assistant's tool calls (chat_dsv4.cpp /
// chat_dsv41.cpp render_tool_calls), each function's parameters following its JSON schema.
//
// so_args form (expand_tool_calls; docs/STRUCTURED.md):
//   {"tool_calls": {"format": "v4" | "v41", "tools": [{"name": ..., "parameters": {schema}} or
//     OpenAI's {"type": "function", "function": {...}}], "mode": "required" | "auto",
//     "parallel": true, "function": "name"}}
// required: the reply is the block (after optional blank lines); auto: free text until the
// DSML marker token (a trigger), then the rest of the block. `function` keeps one tool (one call).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace deepinfer::structured {

class TokenVocabulary;

struct DsmlFormat {
  std::string marker = "｜DSML｜";  // the DSML special token's text
  std::string calls = "tool_calls";
  std::string invoke = "invoke";
  std::string param = "parameter";
  static DsmlFormat v4() { return {}; }
  static DsmlFormat v41() { return {"｜DSML｜", " calls", " invoke", " parameter"}; }
};

struct DsmlTool {
  std::string name;
  nlohmann::ordered_json parameters;  // JSON schema of the arguments (object), null = any
};

// A Lark grammar for the block. Markers are the special token `<[marker_id]>` (a grammar
// terminal). A parameter of type "string" is raw text (string="true"), any other a JSON value
// under its schema (string="false"), an untyped one either; parameters come in the schema's
// order, required ones always, the others optional; a function without `properties` takes any.
// `after_marker`: the grammar starts right after the block's first marker token (the trigger
// form). Throws InvalidArgument for a name DSML cannot carry (a quote, '<', '>', a newline).
std::string dsml_tool_grammar(const std::vector<DsmlTool>& tools, bool parallel, const DsmlFormat& format,
                              int32_t marker_id, bool after_marker = false);

// so_args holding "tool_calls" rewritten as {"ebnf": <block grammar>} (+ trigger_token_ids in
// auto mode); the marker id is the vocabulary's terminal spelled `format.marker`. Other so_args
// come back unchanged. Errors: InvalidArgument naming the field.
nlohmann::ordered_json expand_tool_calls(const nlohmann::ordered_json& so_args, const TokenVocabulary& vocab);

}  // namespace deepinfer::structured
