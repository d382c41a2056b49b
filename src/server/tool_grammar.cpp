// The server's forced tool-call grammar: structured/tool_calls.cpp builds it (the same grammar
// is offered offline as so_args.tool_calls).
#include "server/tool_grammar.h"

#include "core/check.h"
#include "structured/tool_calls.h"

namespace deepinfer::server {

std::string dsml_tool_grammar(const std::vector<ToolSpec>& tools, bool parallel, const DsmlSyntax& syn, int32_t marker) {
  DI_CHECK(!tools.empty(), "dsml_tool_grammar needs a tool");
  std::vector<structured::DsmlTool> ts;
  for (const ToolSpec& t : tools) ts.push_back({t.name, nlohmann::ordered_json::parse(t.parameters.dump())});
  return structured::dsml_tool_grammar(ts, parallel, {syn.marker, syn.calls, syn.invoke, syn.param}, marker);
}

}  // namespace deepinfer::server
