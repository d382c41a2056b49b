// DeepSeek-V4.1 chat format (MODEL-DEEPSEEK-V41.md §8). Behaviour follows the release's
// encoding/encoding.py (read through public ports; docs/MODEL-V41.md lists which):
//  - DSML tags with a leading space: <｜DSML｜ calls> / <｜DSML｜ invoke name=..> / <｜DSML｜ parameter ..>;
//  - <｜System｜> before a first system message and before the reasoning-effort line, and before
//    every later system message, which also counts as a user turn (it gets the assistant header);
//  - numeric reasoning effort 1..100 (low 50, high 75 = default, max 100), thinking mode only,
//    rendered once at the start: "Reasoning Effort: N (range 1-100, ...)\n\n";
//  - tool messages merge into a user turn as <tool_result> blocks sorted into call order,
//    consecutive user turns merge with "\n\n";
//  - reasoning of assistant turns before the last user turn is dropped (and earlier developer
//    turns vanish) in thinking mode unless drop_thinking is off or any message carries tools.
#include <algorithm>
#include <cctype>
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
using chat::replace_all;

constexpr const char* kUser = "<｜User｜>";
constexpr const char* kAssistant = "<｜Assistant｜>";
constexpr const char* kSystem = "<｜System｜>";
constexpr const char* kThinkStart = "<think>";
constexpr const char* kThinkEnd = "</think>";
constexpr const char* kImage = "<｜deepseek_image｜>";
constexpr const char* kCalls = "｜DSML｜ calls";
constexpr const char* kInvoke = "｜DSML｜ invoke";
constexpr const char* kParam = "｜DSML｜ parameter";

// The tools preamble; @C@ / @I@ / @P@ stand for the calls / invoke / parameter tag names.
constexpr const char* kToolsTemplate =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<@C@>\" block like the following:\n\n<@C@>\n<@I@ name=\"$TOOL_NAME\">\n"
    "<@P@ name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</@P@>\n...\n"
    "</@I@>\n<@I@ name=\"$TOOL_NAME2\">\n...\n</@I@>\n</@C@>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n@S@\n\nYou MUST strictly follow the above defined tool name and parameter "
    "schemas to invoke tool calls.\n";

[[noreturn]] void fail(size_t i, const std::string& what) {
  DI_THROW(InvalidArgument, "apply_chat_template_v41: messages[", i, "]", what);
}

// "" -> the default "high"; names low / high / max; or an integer 1..100.
int effort_budget(const std::string& e) {
  if (e.empty() || e == "high") return 75;
  if (e == "low") return 50;
  if (e == "max") return 100;
  if (!e.empty() && e.size() <= 3 && std::all_of(e.begin(), e.end(), [](char c) { return std::isdigit((unsigned char)c); })) {
    const int v = std::stoi(e);
    if (v >= 1 && v <= 100) return v;
  }
  DI_THROW(InvalidArgument, "apply_chat_template_v41: reasoning_effort '", e,
           "' must be an integer in [1, 100] or one of low (50), high (75, the default), max (100)");
}

ojson parse_json(const std::string& text, size_t i, const std::string& what) {
  ojson j;
  std::string why;
  if (!parse_json_bounded(text, j, &why)) fail(i, "." + what + " is not valid JSON: " + why);
  return j;
}

std::string render_tools(const std::string& tools_json, size_t i) {
  const ojson tools = parse_json(tools_json, i, "tools_json");
  if (!tools.is_array()) fail(i, ".tools_json must be a JSON array of {\"type\": \"function\", \"function\": {...}}");
  std::string schemas;
  for (size_t k = 0; k < tools.size(); ++k) {
    if (!tools[k].is_object() || !tools[k].contains("function"))
      fail(i, ".tools_json[" + std::to_string(k) + "] has no 'function'");
    if (k) schemas += "\n";
    schemas += chat::py_json(tools[k]["function"]);
  }
  std::string s = replace_all(replace_all(replace_all(kToolsTemplate, "@C@", kCalls), "@I@", kInvoke), "@P@", kParam);
  return replace_all(s, "@S@", schemas);
}

std::string render_extras(const Message& m, size_t i) {
  std::string s;
  if (!m.tools_json.empty()) s += "\n\n" + render_tools(m.tools_json, i);
  if (!m.response_format_json.empty())
    s += "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
         chat::py_json(parse_json(m.response_format_json, i, "response_format_json"));
  return s;
}

std::string render_tool_calls(const Message& m, size_t i) {
  if (m.tool_calls.empty()) return "";
  std::string calls;
  for (size_t k = 0; k < m.tool_calls.size(); ++k) {
    const ToolCall& tc = m.tool_calls[k];
    const std::string where = ".tool_calls[" + std::to_string(k) + "].arguments";
    const ojson args = parse_json(tc.arguments, i, where.substr(1));
    if (!args.is_object()) fail(i, where + " must be a JSON object");
    std::string params;
    for (auto it = args.begin(); it != args.end(); ++it) {
      const bool is_str = it.value().is_string();
      if (!params.empty()) params += "\n";
      params += std::string("<") + kParam + " name=\"" + it.key() + "\" string=\"" + (is_str ? "true" : "false") + "\">" +
                (is_str ? it.value().get<std::string>() : chat::py_json(it.value())) + "</" + kParam + ">";
    }
    if (k) calls += "\n";
    calls += std::string("<") + kInvoke + " name=\"" + tc.name + "\">\n" + params + "\n</" + kInvoke + ">";
  }
  return std::string("\n\n<") + kCalls + ">\n" + calls + "\n</" + kCalls + ">";
}

struct Block {
  bool tool_result = false;
  std::string text, tool_use_id;
};
struct Turn {
  const Message* src = nullptr;  // the message (for a merged user turn: its first one)
  std::string role;
  std::vector<Block> blocks;     // user turns
  bool drop_reasoning = false;
  size_t index = 0;              // position in the caller's list (for messages)
};

// Tool outputs become blocks of a user turn and consecutive user turns merge; tool results are
// then put in the order of the latest assistant turn's calls.
std::vector<Turn> merge_turns(std::span<const Message> messages) {
  std::vector<Turn> turns;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    if (std::none_of(std::begin(kRoles), std::end(kRoles), [&](const char* r) { return m.role == r; }))
      fail(i, ".role '" + m.role + "' is not one of system, developer, user, assistant, tool");
    // Images are content blocks in the reference; a literal placeholder in text is refused as there.
    if (m.content.find(kImage) != std::string::npos || m.reasoning_content.value_or("").find(kImage) != std::string::npos)
      fail(i, " contains the image token <｜deepseek_image｜> in its text (images are not supported)");
    if (m.role == "developer" && m.content.empty()) fail(i, " (developer) has empty content");
    if (m.role == "tool" || m.role == "user") {
      Block b{m.role == "tool", m.content, m.tool_call_id};
      if (!turns.empty() && turns.back().role == "user") turns.back().blocks.push_back(b);
      else turns.push_back(Turn{&m, "user", {b}, false, i});
    } else {
      turns.push_back(Turn{&m, m.role, {}, false, i});
    }
  }
  chat::order_tool_results(turns);
  return turns;
}

// User and developer turns, and a system turn that is not the first, get the assistant header.
bool opens_assistant(const std::vector<Turn>& turns, size_t i) {
  return turns[i].role == "user" || turns[i].role == "developer" || (turns[i].role == "system" && i > 0);
}
int last_user(const std::vector<Turn>& turns) {
  for (size_t i = turns.size(); i-- > 0;)
    if (opens_assistant(turns, i)) return int(i);
  return -1;
}

std::string render_turn(const std::vector<Turn>& turns, size_t i, bool thinking, bool drop, int lu, const std::string& eos) {
  const Turn& t = turns[i];
  const Message& m = *t.src;
  std::string p;
  if (t.role == "system") {
    if (i > 0) p += kSystem;
    p += m.content + render_extras(m, t.index);
  } else if (t.role == "developer") {
    p += kUser + m.content + render_extras(m, t.index);
  } else if (t.role == "user") {
    p += kUser;
    for (size_t k = 0; k < t.blocks.size(); ++k) {
      if (k) p += "\n\n";
      p += t.blocks[k].tool_result ? "<tool_result>" + t.blocks[k].text + "</tool_result>" : t.blocks[k].text;
    }
  } else {  // assistant
    if (thinking && (!drop || int(i) > lu) && !t.drop_reasoning) p += m.reasoning_content.value_or("") + kThinkEnd;
    p += m.content + render_tool_calls(m, t.index) + eos;
  }
  return p;
}
}  // namespace

std::string Tokenizer::apply_chat_template_v41(std::span<const Message> messages, const ChatOptionsV41& opt) const {
  const int budget = effort_budget(opt.reasoning_effort);  // validated in chat mode too, as the reference does
  std::vector<Turn> turns = merge_turns(messages);
  bool drop = opt.drop_thinking;
  for (const Message& m : messages)
    if (!m.tools_json.empty()) drop = false;  // tool use keeps all reasoning
  if (opt.thinking && drop) {
    const int lu = last_user(turns);
    std::vector<Turn> kept;
    for (size_t i = 0; i < turns.size(); ++i) {
      Turn t = turns[i];
      if (int(i) < lu && t.role == "developer") continue;
      if (int(i) < lu && t.role == "assistant") t.drop_reasoning = true;
      kept.push_back(std::move(t));
    }
    turns = std::move(kept);
  }
  const int lu = last_user(turns);
  std::string p = opt.add_bos ? impl_->bos_text : "";
  for (size_t i = 0; i < turns.size(); ++i) {
    if (i == 0) {  // one <｜System｜> hosts the effort line and a leading system message
      const bool effort = opt.thinking;
      if (effort || turns[0].role == "system") p += kSystem;
      if (effort) p += "Reasoning Effort: " + std::to_string(budget) +
                       " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
    }
    p += render_turn(turns, i, opt.thinking, drop, lu, impl_->eos_text);
    const bool last = i + 1 == turns.size();
    if (!last && turns[i + 1].role != "assistant") continue;
    if (last && !opt.add_generation_prompt) continue;
    if (opens_assistant(turns, i)) {
      p += kAssistant;
      p += opt.thinking && (!drop || int(i) >= lu) ? kThinkStart : kThinkEnd;
    }
  }
  return p;
}

}  // namespace deepinfer
