#include "tokenizer/pretokenize.h"

#include "core/check.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tok {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {
using Span = std::pair<uint32_t, uint32_t>;
struct Seg {
  uint32_t b, e;
  bool match;
};

// Splits piece [b, e) of text with one step, appending the resulting pieces (HF Split semantics).
void split_piece(const SplitStep& st, std::string_view text, uint32_t b, uint32_t e, std::vector<Piece>& out,
                 std::vector<Span>& found, std::vector<Seg>& segs) {
  found.clear();
  st.regex.find_all(text.substr(b, e - b), found);
  // Alternate gaps and matches over the whole piece.
  segs.clear();
  uint32_t prev = 0, len = e - b;
  for (auto [mb, me] : found) {
    if (mb > prev) segs.push_back({prev, mb, st.invert});
    segs.push_back({mb, me, !st.invert});
    prev = me;
  }
  if (prev < len) segs.push_back({prev, len, st.invert});

  auto emit = [&](uint32_t sb, uint32_t se) {
    if (se > sb) out.push_back({b + sb, b + se, false});
  };
  size_t first = out.size();
  switch (st.behavior) {
    case SplitBehavior::kRemoved:
      for (auto& s : segs)
        if (!s.match) emit(s.b, s.e);
      break;
    case SplitBehavior::kIsolated:
      for (auto& s : segs) emit(s.b, s.e);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (auto& s : segs) {
        if (s.match && !prev_match && out.size() > first) out.back().end = b + s.e;
        else emit(s.b, s.e);
        prev_match = s.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // Walk backwards: a match joins the piece after it.
      std::vector<Piece> rev;
      bool prev_match = false;
      for (size_t k = segs.size(); k-- > 0;) {
        const Seg& s = segs[k];
        if (s.match && !prev_match && !rev.empty()) rev.back().begin = b + s.b;
        else rev.push_back({b + s.b, b + s.e, false});
        prev_match = s.match;
      }
      for (size_t k = rev.size(); k-- > 0;) out.push_back(rev[k]);
      break;
    }
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      bool any = false;
      for (auto& s : segs) {
        if (any && s.match == prev_match) out.back().end = b + s.e;
        else emit(s.b, s.e);
        any = true;
        prev_match = s.match;
      }
      break;
    }
  }
}
}  // namespace

void PreTokenizer::run(std::string_view text, std::vector<Piece>& out) const {
  thread_local std::vector<Piece> cur, nxt;
  thread_local std::vector<Span> found;
  thread_local std::vector<Seg> segs;
  cur.clear();
  if (!text.empty()) cur.push_back({0, uint32_t(text.size()), false});
  for (const SplitStep& st : splits) {
    nxt.clear();
    for (const Piece& p : cur) split_piece(st, text, p.begin, p.end, nxt, found, segs);
    std::swap(cur, nxt);
  }
  if (byte_level) {
    for (Piece& p : cur) p.prefix_space = byte_level->add_prefix_space && text[p.begin] != ' ';
    if (byte_level->use_regex) {
      // The prefix space takes part in the GPT-2 split; handle it with a copy of the piece.
      std::string tmp;
      for (const Piece& p : cur) {
        if (!p.prefix_space) {
          found.clear();
          gpt2_regex->find_all(text.substr(p.begin, p.end - p.begin), found);
          uint32_t prev = 0;
          for (auto [mb, me] : found) {
            if (mb > prev) out.push_back({p.begin + prev, p.begin + mb, false});
            out.push_back({p.begin + mb, p.begin + me, false});
            prev = me;
          }
          if (prev < p.end - p.begin) out.push_back({p.begin + prev, p.end, false});
        } else {
          // " " + piece: the first match may include the added space; mark it with prefix_space
          // and offsets into the original text (the space is virtual at position begin).
          tmp.assign(" ");
          tmp.append(text.substr(p.begin, p.end - p.begin));
          found.clear();
          gpt2_regex->find_all(tmp, found);
          uint32_t prev = 0;
          auto push = [&](uint32_t sb, uint32_t se) {
            if (sb == 0) out.push_back({p.begin, p.begin + se - 1, true});
            else out.push_back({p.begin + sb - 1, p.begin + se - 1, false});
          };
          for (auto [mb, me] : found) {
            if (mb > prev) push(prev, mb);
            push(mb, me);
            prev = me;
          }
          if (prev < tmp.size()) push(prev, uint32_t(tmp.size()));
        }
      }
      return;
    }
  }
  out.insert(out.end(), cur.begin(), cur.end());
}

PreTokenizer PreTokenizer::clone() const {
  PreTokenizer p;
  for (const SplitStep& s : splits) p.splits.push_back({s.regex.clone(), s.behavior, s.invert});
  p.byte_level = byte_level;
  if (gpt2_regex) p.gpt2_regex = std::make_unique<Regex>(gpt2_regex->clone());
  return p;
}

std::string Normalizer::run(std::string_view text) const {
  std::string s(text);
  std::vector<std::pair<uint32_t, uint32_t>> found;
  for (const NormalizerStep& st : steps) {
    switch (st.kind) {
      case NormalizerStep::kPrepend:
        if (!s.empty()) s = st.text + s;
        break;
      case NormalizerStep::kReplace: {
        found.clear();
        st.pattern->find_all(s, found);
        std::string r;
        uint32_t prev = 0;
        for (auto [b, e] : found) {
          r.append(s, prev, b - prev);
          r += st.text;
          prev = e;
        }
        r.append(s, prev, std::string::npos);
        s = std::move(r);
        break;
      }
      case NormalizerStep::kStripLeft: {
        size_t i = 0, j = 0;
        while (j < s.size()) {
          size_t k = j;
          if (!is_unicode_whitespace(next_cp(s, k))) break;
          j = k;
          i = j;
        }
        s.erase(0, i);
        break;
      }
      case NormalizerStep::kStripRight: {
        size_t keep = 0, j = 0;
        while (j < s.size()) {
          uint32_t cp = next_cp(s, j);
          if (!is_unicode_whitespace(cp)) keep = j;
        }
        s.resize(keep);
        break;
      }
    }
  }
  return s;
}

Normalizer Normalizer::clone() const {
  Normalizer n;
  for (const NormalizerStep& st : steps)
    n.steps.push_back({st.kind, st.text, st.pattern ? std::make_unique<Regex>(st.pattern->clone()) : nullptr});
  return n;
}

}  // namespace deepinfer::tok
