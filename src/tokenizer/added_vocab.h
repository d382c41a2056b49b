// Added tokens (special or not) and the matcher that cuts them out of text before the model
// runs: leftmost-longest matching as HF's Aho-Corasick (MatchKind::LeftmostLongest), with the
// lstrip / rstrip / single_word options.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deepinfer::tok {

struct AddedToken {
  int32_t id;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Byte trie over a set of added tokens.
class AddedMatcher {
 public:
  void build(const std::vector<const AddedToken*>& tokens);
  bool empty() const { return tokens_.empty(); }

  struct Hit {
    uint32_t begin, end;  // absorbed span (includes stripped whitespace)
    int32_t id;
  };
  // Appends hits in text order, non-overlapping.
  void find_all(std::string_view text, std::vector<Hit>& out) const;

 private:
  struct Node {
    int32_t token = -1;  // index into tokens_ when a token ends here
    std::vector<std::pair<unsigned char, int32_t>> kids;  // sorted by byte
  };
  int32_t child(int32_t node, unsigned char c) const;
  std::vector<Node> nodes_;
  std::vector<const AddedToken*> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace deepinfer::tok
