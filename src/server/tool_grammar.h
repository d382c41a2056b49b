// The grammar that forces a DSML tool-call block (tool_choice "required" or a named function):
// a Lark grammar whose DSML markers are the special token itself (`<[id]>`, a grammar terminal:
// structured.h TokenizerInfo::terminal_ids) and whose parameter values follow the function's
// JSON schema: a property of type "string" is raw text (string="true"), any other is a JSON
// value under the property's schema (%json, string="false"), an untyped property may be either.
// Parameters come in the schema's order, the required ones always, the others optional; a
// function without `properties` takes any parameters. The block is the text the chat template
// renders for an assistant's tool calls (chat_dsv4.cpp / chat_dsv41.cpp render_tool_calls).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/chat_parser.h"

namespace deepinfer::server {

struct ToolSpec {
  std::string name;
  nlohmann::json parameters;  // JSON schema of the arguments (object), null = any
};

// `tools`: the functions the block may call (one for a named tool_choice). `parallel`: more than
// one call allowed. `marker_id`: the DSML special token's id. Throws InvalidArgument for a tool
// name or property name the DSML syntax cannot carry (a quote, '<', a newline).
std::string dsml_tool_grammar(const std::vector<ToolSpec>& tools, bool parallel, const DsmlSyntax& syntax,
                              int32_t marker_id);

}  // namespace deepinfer::server
