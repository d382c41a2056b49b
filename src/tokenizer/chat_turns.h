// Pieces both DeepSeek chat encoders (chat_dsv4.cpp, chat_dsv41.cpp) share: the template text
// substitution and the tool-result ordering of DeepSeek's encoding scripts. Each encoder keeps its
// own Turn / Block types (V4's turns carry their text apart); these work on any with the fields used.
#pragma once
#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace deepinfer::chat {

inline std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
  return s;
}

// Tool results inside a user turn follow the order of the calls in the latest assistant turn that
// made calls (by tool_use_id; results with an unknown id sort first, stably), as the reference does.
// Turn: .role, .src->tool_calls[k].id, .blocks; Block: .tool_result, .tool_use_id.
template <typename Turn>
void order_tool_results(std::vector<Turn>& turns) {
  std::map<std::string, int> order;
  for (Turn& t : turns) {
    if (t.role == "assistant" && !t.src->tool_calls.empty()) {
      order.clear();
      for (size_t k = 0; k < t.src->tool_calls.size(); ++k)
        if (!t.src->tool_calls[k].id.empty()) order[t.src->tool_calls[k].id] = int(k);
    } else if (t.role == "user" && !order.empty()) {
      using Block = typename decltype(t.blocks)::value_type;
      std::vector<Block> results;
      for (const Block& b : t.blocks)
        if (b.tool_result) results.push_back(b);
      if (results.size() < 2) continue;
      auto key = [&](const Block& b) {
        auto it = order.find(b.tool_use_id);
        return it == order.end() ? 0 : it->second;
      };
      std::stable_sort(results.begin(), results.end(), [&](const Block& a, const Block& b) { return key(a) < key(b); });
      size_t r = 0;
      for (Block& b : t.blocks)
        if (b.tool_result) b = results[r++];
    }
  }
}

}  // namespace deepinfer::chat
