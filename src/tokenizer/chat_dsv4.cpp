// DeepSeek-V4 chat format (MODEL-DEEPSEEK-V4.md §8.2). Behaviour follows DeepSeek's
// encoding/encoding_dsv4.py: tool messages merge into user turns as <tool_result> blocks,
// consecutive user turns merge, earlier reasoning is dropped unless tools are present, and
// assistant tool calls are written in DSML.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/json.h"
#include "tokenizer/chat_json.h"
#include "tokenizer/chat_turns.h"
#include "tokenizer/tokenizer_impl.h"

namespace deepinfer {
namespace {
using ojson = nlohmann::ordered_json;
using chat::py_json;
using chat::replace_all;

constexpr const char* kUser = "<｜User｜>";
constexpr const char* kAssistant = "<｜Assistant｜>";
constexpr const char* kThinkStart = "<think>";
constexpr const char* kThinkEnd = "</think>";
constexpr const char* kDsml = "｜DSML｜";

constexpr const char* kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

// The tools preamble; "@D@" stands for the DSML marker.
constexpr const char* kToolsTemplate =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<@D@tool_calls>\" block like the following:\n\n<@D@tool_calls>\n<@D@invoke name=\"$TOOL_NAME\">\n"
    "<@D@parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</@D@parameter>\n...\n"
    "</@D@invoke>\n<@D@invoke name=\"$TOOL_NAME2\">\n...\n</@D@invoke>\n</@D@tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n@S@\n\nYou MUST strictly follow the above defined tool name and parameter "
    "schemas to invoke tool calls.\n";

// Depth-bounded (core/json.h): py_dump below recurses once per level of these values.
ojson parse_json_field(const std::string& text, const std::string& what, size_t msg_index) {
  ojson j;
  std::string why;
  if (!parse_json_bounded(text, j, &why))
    DI_THROW(InvalidArgument, "apply_chat_template: messages[", msg_index, "].", what, " is not valid JSON: ", why);
  return j;
}

struct Block {
  bool tool_result;
  std::string text;
  std::string tool_use_id;
};
struct Turn {
  const Message* src = nullptr;  // original message (assistant/system/developer fields)
  std::string role;
  std::string content;
  std::vector<Block> blocks;  // user turns
  bool drop_reasoning = false;
  size_t index = 0;  // position in the caller's list (for messages)
};

std::string render_tools(const std::string& tools_json, size_t i) {
  ojson tools = parse_json_field(tools_json, "tools_json", i);
  if (!tools.is_array()) DI_THROW(InvalidArgument, "apply_chat_template: messages[", i, "].tools_json must be a JSON array");
  std::string schemas;
  for (size_t k = 0; k < tools.size(); ++k) {
    const ojson& t = tools[k];
    const ojson& fn = t.is_object() && t.contains("function") ? t["function"] : t;
    if (k) schemas += "\n";
    schemas += py_json(fn);
  }
  return replace_all(replace_all(kToolsTemplate, "@D@", kDsml), "@S@", schemas);
}

std::string render_extras(const Message& m, size_t i) {
  std::string s;
  if (!m.tools_json.empty()) s += "\n\n" + render_tools(m.tools_json, i);
  if (!m.response_format_json.empty())
    s += "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
         py_json(parse_json_field(m.response_format_json, "response_format_json", i));
  return s;
}

std::string render_tool_calls(const Message& m, size_t i) {
  if (m.tool_calls.empty()) return "";
  std::string calls;
  for (size_t k = 0; k < m.tool_calls.size(); ++k) {
    const ToolCall& tc = m.tool_calls[k];
    ojson args;
    if (json_depth_exceeded_at(tc.arguments, kMaxJsonDepth) != std::string::npos)
      DI_THROW(InvalidArgument, "apply_chat_template: messages[", i, "].tool_calls[", k, "].arguments: JSON nested deeper than ",
               kMaxJsonDepth, " levels");
    if (!parse_json_bounded(tc.arguments, args, nullptr))
      args = ojson::object({{"arguments", tc.arguments}});  // not JSON: passed through as one string
    if (!args.is_object())
      DI_THROW(InvalidArgument, "apply_chat_template: messages[", i, "].tool_calls[", k, "].arguments must be a JSON object");
    std::string params;
    for (auto it = args.begin(); it != args.end(); ++it) {
      bool is_str = it.value().is_string();
      if (!params.empty()) params += "\n";
      params += std::string("<") + kDsml + "parameter name=\"" + it.key() + "\" string=\"" + (is_str ? "true" : "false") +
                "\">" + (is_str ? it.value().get<std::string>() : py_json(it.value())) + "</" + kDsml + "parameter>";
    }
    if (k) calls += "\n";
    calls += std::string("<") + kDsml + "invoke name=\"" + tc.name + "\">\n" + params + "\n</" + kDsml + "invoke>";
  }
  return std::string("\n\n<") + kDsml + "tool_calls>\n" + calls + "\n</" + kDsml + "tool_calls>";
}

// Tool outputs become blocks of a user turn; consecutive user turns merge.
std::vector<Turn> merge_turns(std::span<const Message> messages) {
  std::vector<Turn> turns;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    if (std::find_if(std::begin(kRoles), std::end(kRoles), [&](const char* r) { return m.role == r; }) == std::end(kRoles))
      DI_THROW(InvalidArgument, "apply_chat_template: messages[", i, "].role '", m.role,
               "' is not one of system, developer, user, assistant, tool");
    bool merge = !turns.empty() && turns.back().role == "user";
    if (m.role == "tool" || m.role == "user") {
      Block b{m.role == "tool", m.content, m.tool_call_id};
      if (merge) {
        turns.back().blocks.push_back(b);
      } else {
        turns.push_back(Turn{&m, "user", m.content, {b}, false, i});
      }
    } else {
      if (m.role == "developer" && m.content.empty())
        DI_THROW(InvalidArgument, "apply_chat_template: messages[", i, "] (developer) has empty content");
      turns.push_back(Turn{&m, m.role, m.content, {}, false, i});
    }
  }
  chat::order_tool_results(turns);
  return turns;
}

int last_user(const std::vector<Turn>& turns) {
  for (size_t i = turns.size(); i-- > 0;)
    if (turns[i].role == "user" || turns[i].role == "developer") return int(i);
  return -1;
}
}  // namespace

std::string Tokenizer::apply_chat_template(std::span<const Message> messages, const ChatOptions& opt) const {
  const std::string& effort = opt.reasoning_effort;
  if (!effort.empty() && effort != "high" && effort != "max")
    DI_THROW(InvalidArgument, "apply_chat_template: reasoning_effort '", effort, "' must be '', 'high' or 'max'");
  std::vector<Turn> turns = merge_turns(messages);
  bool drop = opt.drop_thinking;
  for (const Message& m : messages)
    if (!m.tools_json.empty()) drop = false;  // tool use keeps all reasoning
  if (opt.thinking && drop) {
    // Before the last user turn: assistant reasoning is removed and developer turns vanish.
    int lu = last_user(turns);
    std::vector<Turn> kept;
    for (size_t i = 0; i < turns.size(); ++i) {
      Turn t = turns[i];
      if (int(i) < lu && t.role == "developer") continue;
      if (int(i) < lu && t.role == "assistant") t.drop_reasoning = true;
      kept.push_back(std::move(t));
    }
    turns = std::move(kept);
  }
  int lu = last_user(turns);
  std::string p = opt.add_bos ? impl_->bos_text : "";
  for (size_t i = 0; i < turns.size(); ++i) {
    const Turn& t = turns[i];
    const Message& m = *t.src;
    if (i == 0 && opt.thinking && effort == "max") p += kReasoningEffortMax;
    if (t.role == "system") {
      p += t.content + render_extras(m, t.index);
    } else if (t.role == "developer") {
      p += kUser + t.content + render_extras(m, t.index);
    } else if (t.role == "user") {
      p += kUser;
      for (size_t k = 0; k < t.blocks.size(); ++k) {
        if (k) p += "\n\n";
        p += t.blocks[k].tool_result ? "<tool_result>" + t.blocks[k].text + "</tool_result>" : t.blocks[k].text;
      }
    } else {  // assistant
      if (opt.thinking && (!drop || int(i) > lu) && !t.drop_reasoning)
        p += m.reasoning_content.value_or("") + kThinkEnd;
      p += t.content + render_tool_calls(m, t.index) + impl_->eos_text;
    }
    // After a user/developer turn comes the assistant tag, unless another non-assistant turn follows.
    bool last = i + 1 == turns.size();
    if (!last && turns[i + 1].role != "assistant") continue;
    if (last && !opt.add_generation_prompt) continue;
    if (t.role == "user" || t.role == "developer") {
      p += kAssistant;
      p += (opt.thinking && (!drop || int(i) >= lu)) ? kThinkStart : kThinkEnd;
    }
  }
  return p;
}

}  // namespace deepinfer
