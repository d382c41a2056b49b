// Splits a chat reply, as it streams, into reasoning, content and tool calls (DeepSeek-V4 and
// V4.1 formats: MODEL-DEEPSEEK-V4.md §8.2, MODEL-DEEPSEEK-V41.md §8).
//
//   [<think>] reasoning </think> content \n\n<｜DSML｜tool_calls>
//   <｜DSML｜invoke name="f">
//   <｜DSML｜parameter name="p" string="true">raw text</｜DSML｜parameter>
//   <｜DSML｜parameter name="q" string="false">JSON value</｜DSML｜parameter>
//   </｜DSML｜invoke>
//   </｜DSML｜tool_calls><eos>                 (V4.1: "<｜DSML｜ calls>", " invoke", " parameter")
//
// A state machine over the engine's text (detokenized with special tokens kept): feed() takes
// each new piece and returns what can be said for sure; text that could still turn out to be
// the start of a tag (a tag split across pieces, the whitespace before a calls block, a
// partial end-of-sentence) is held back until the next piece decides it, so no DSML markup
// ever reaches `content`. Tool-call arguments are written as JSON as the parameters arrive
// ({"p": "raw text", "q": <JSON value>}), string values escaped piece by piece. The pieces of
// one reply concatenate to the same result however the text was split (tests feed every split).
// The reasoning state is where the prompt left the model: the thinking prompt ends with <think>
// (start in reasoning), the chat prompt with </think> (start in content); a reply that never
// closes its thinking is all reasoning.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::server {

struct DsmlSyntax {
  std::string marker = "｜DSML｜";  // the DSML special token's text
  std::string calls = "tool_calls";
  std::string invoke = "invoke";
  std::string param = "parameter";
  static DsmlSyntax v4() { return {}; }
  static DsmlSyntax v41() { return {"｜DSML｜", " calls", " invoke", " parameter"}; }
};

struct ToolCallDelta {
  int index = 0;          // which call of this reply
  std::string id, name;   // on the call's first delta only
  std::string arguments;  // the next piece of the arguments' JSON text
};

struct ChatDelta {
  std::string reasoning, content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void append(ChatDelta&& d);  // merges pieces (same call index: arguments concatenated)
};

struct ChatParserOptions {
  bool thinking = false;     // the reply starts inside the reasoning
  bool parse_tools = true;   // false: DSML markers are only removed from the content
  DsmlSyntax syntax;
  std::string think_start = "<think>", think_end = "</think>";
  std::string eos_text;      // the end-of-sentence token's text: dropped with what follows
  std::function<std::string()> new_call_id;  // "call_..." ids
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(ChatParserOptions options);
  ChatDelta feed(std::string_view text);
  ChatDelta finish();  // end of the reply: what was held back
  int num_calls() const { return num_calls_; }
  bool malformed() const { return malformed_; }  // a calls block that did not parse
  bool in_reasoning() const { return state_ == State::kReasoning; }

 private:
  enum class State { kReasoning, kContent, kCalls, kInvoke, kValue, kDone };
  bool step(ChatDelta& d);  // one transition; false when it needs more text
  bool step_reasoning(ChatDelta& d);
  bool step_content(ChatDelta& d);
  bool step_calls(ChatDelta& d);
  bool step_invoke(ChatDelta& d);
  bool step_value(ChatDelta& d);
  void fail();  // malformed block: the rest is content
  void emit_content(ChatDelta& d, std::string_view text);
  void emit_value(ChatDelta& d, std::string_view text);
  size_t cut_eos();  // buf_ after the end-of-sentence text is dropped; returns the usable length

  ChatParserOptions o_;
  State state_;
  std::string buf_;
  bool final_ = false, at_start_ = true, malformed_ = false;
  int num_calls_ = 0;
  bool args_open_ = false, value_is_string_ = false;
  std::string tag_open_;  // "<｜DSML｜tool_calls>" etc., built once
  std::string invoke_open_, calls_close_, param_open_, invoke_close_, param_close_;
};

// Escapes `text` as the inside of a JSON string (quotes, backslashes, control characters).
std::string json_escape(std::string_view text);

}  // namespace deepinfer::server
