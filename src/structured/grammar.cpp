#include "structured/grammar.h"

#include <algorithm>
#include <cstdio>

#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::structured {
namespace {

int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void utf8_encode(uint32_t cp, uint8_t* out) {
  switch (utf8_len(cp)) {
    case 1: out[0] = static_cast<uint8_t>(cp); break;
    case 2: out[0] = 0xC0 | (cp >> 6); out[1] = 0x80 | (cp & 0x3F); break;
    case 3: out[0] = 0xE0 | (cp >> 12); out[1] = 0x80 | ((cp >> 6) & 0x3F); out[2] = 0x80 | (cp & 0x3F); break;
    default:
      out[0] = 0xF0 | (cp >> 18); out[1] = 0x80 | ((cp >> 12) & 0x3F);
      out[2] = 0x80 | ((cp >> 6) & 0x3F); out[3] = 0x80 | (cp & 0x3F);
  }
}

// Splits [lo, hi] (same UTF-8 length) until each piece is a product of per-byte ranges
// (the classic utf8-ranges construction); appends one byte-range sequence per piece.
void split_utf8(uint32_t lo, uint32_t hi, std::vector<std::vector<ByteRange>>& out) {
  int n = utf8_len(lo);
  for (int i = 1; i < n; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_utf8(lo, lo | m, out);
        split_utf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split_utf8(lo, (hi & ~m) - 1, out);
        split_utf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  utf8_encode(lo, a);
  utf8_encode(hi, b);
  std::vector<ByteRange> seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out.push_back(std::move(seq));
}

}  // namespace

GrammarBuilder::GrammarBuilder() {
  g_.exprs.reserve(256);  // a schema's lowering makes hundreds to thousands
  g_.exprs.push_back(Expr{.kind = ExprKind::kNothing});
  g_.exprs.push_back(Expr{.kind = ExprKind::kEmpty});
}

ExprId GrammarBuilder::add(Expr e) {
  g_.exprs.push_back(std::move(e));
  return static_cast<ExprId>(g_.exprs.size() - 1);
}

ExprId GrammarBuilder::bytes(std::vector<ByteRange> ranges) {
  if (ranges.empty()) return kNothingId;
  // Sorted and merged in place (the vector is ours: one allocation fewer per byte set).
  if (ranges.size() > 1) {
    std::sort(ranges.begin(), ranges.end(), [](ByteRange a, ByteRange b) { return a.lo < b.lo; });
    size_t w = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const ByteRange r = ranges[i];
      if (w > 0 && static_cast<int>(r.lo) <= static_cast<int>(ranges[w - 1].hi) + 1)
        ranges[w - 1].hi = std::max(ranges[w - 1].hi, r.hi);
      else
        ranges[w++] = r;
    }
    ranges.resize(w);
  }
  return add(Expr{.kind = ExprKind::kBytes, .ranges = std::move(ranges)});
}

ExprId GrammarBuilder::literal(std::string_view s) {
  std::vector<ExprId> parts;
  parts.reserve(s.size());
  for (char c : s) parts.push_back(byte(static_cast<uint8_t>(c)));
  return seq(std::move(parts));
}

namespace {
// The parts of a seq / alt with the neutral element (`skip`) dropped and nested `nest`s spliced in.
std::vector<ExprId> flatten(const Grammar& g, const std::vector<ExprId>& parts, ExprKind skip, ExprKind nest) {
  std::vector<ExprId> out;
  for (ExprId p : parts) {
    const Expr& e = g.exprs[p];
    if (e.kind == skip) continue;
    if (e.kind == nest)
      out.insert(out.end(), e.children.begin(), e.children.end());
    else
      out.push_back(p);
  }
  return out;
}
}  // namespace

ExprId GrammarBuilder::seq(std::vector<ExprId> parts) {
  // Parts that need no flattening (no Nothing, Empty or Seq among them) become the children
  // as they are: the vector is ours, so no copy (most sequences of a lowering are such).
  bool plain = true;
  for (ExprId p : parts) {
    const ExprKind k = g_.exprs[p].kind;
    if (k == ExprKind::kNothing) return kNothingId;
    if (k == ExprKind::kEmpty || k == ExprKind::kSeq) plain = false;
  }
  if (plain) {
    if (parts.empty()) return kEmptyId;
    if (parts.size() == 1) return parts[0];
    return add(Expr{.kind = ExprKind::kSeq, .children = std::move(parts)});
  }
  std::vector<ExprId> out = flatten(g_, parts, ExprKind::kEmpty, ExprKind::kSeq);
  if (out.empty()) return kEmptyId;
  if (out.size() == 1) return out[0];
  return add(Expr{.kind = ExprKind::kSeq, .children = std::move(out)});
}

ExprId GrammarBuilder::alt(std::vector<ExprId> parts) {
  // As seq: without a Nothing or Alt among the parts, they are sorted in place.
  bool plain = true;
  for (ExprId p : parts) {
    const ExprKind k = g_.exprs[p].kind;
    if (k == ExprKind::kNothing || k == ExprKind::kAlt) plain = false;
  }
  std::vector<ExprId> out = plain ? std::move(parts) : flatten(g_, parts, ExprKind::kNothing, ExprKind::kAlt);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty()) return kNothingId;
  if (out.size() == 1) return out[0];
  return add(Expr{.kind = ExprKind::kAlt, .children = std::move(out)});
}

ExprId GrammarBuilder::repeat(ExprId e, int32_t min, int32_t max) {
  DI_CHECK(min >= 0 && (max == kUnbounded || max >= min), "repeat bounds ", min, "..", max);
  const Expr& x = g_.exprs[e];
  if (max == 0 || x.kind == ExprKind::kEmpty) return kEmptyId;
  if (x.kind == ExprKind::kNothing) return min == 0 ? kEmptyId : kNothingId;
  if (min == 1 && max == 1) return e;
  return add(Expr{.kind = ExprKind::kRepeat, .children = {e}, .min = min, .max = max});
}

ExprId GrammarBuilder::automaton(ByteAutomaton a) {
  DI_CHECK(static_cast<int32_t>(a.final.size()) == a.num_states, "automaton finals");
  g_.automata.push_back(std::move(a));
  return add(Expr{.kind = ExprKind::kAutomaton, .automaton = static_cast<int32_t>(g_.automata.size() - 1)});
}

ExprId GrammarBuilder::marked_byte(uint8_t c, GrammarMark m) {
  g_.marks.push_back(std::move(m));
  return add(Expr{.kind = ExprKind::kBytes,
                  .ranges = {{c, c}},
                  .mark = static_cast<int32_t>(g_.marks.size() - 1)});
}

ExprId GrammarBuilder::codepoint_range(uint32_t lo, uint32_t hi) {
  return codepoints({{lo, hi}});
}

ExprId GrammarBuilder::codepoints(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  std::vector<std::vector<ByteRange>> seqs;
  static constexpr uint32_t kBounds[][2] = {{0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF},
                                             {0x10000, 0x10FFFF}};
  for (auto [lo, hi] : ranges) {
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    for (auto& b : kBounds) {
      uint32_t l = std::max(lo, b[0]), h = std::min(hi, b[1]);
      if (l <= h) split_utf8(l, h, seqs);
    }
  }
  // Single-byte pieces merge into one byte set; multi-byte pieces become sequences.
  std::vector<ByteRange> ascii;
  std::vector<ExprId> alts;
  for (auto& s : seqs) {
    if (s.size() == 1) {
      ascii.push_back(s[0]);
      continue;
    }
    std::vector<ExprId> parts;
    for (ByteRange r : s) parts.push_back(bytes({r}));
    alts.push_back(seq(std::move(parts)));
  }
  if (!ascii.empty()) alts.push_back(bytes(std::move(ascii)));
  return alt(std::move(alts));
}

std::string special_token_bytes(int32_t id) {
  DI_CHECK(id >= 0 && id <= kMaxTerminalId, "special token id ", id);
  std::string b(1, '\xFF');
  for (int shift = 18; shift >= 0; shift -= 6) b += static_cast<char>(0x80 | ((id >> shift) & 0x3F));
  return b;
}

ExprId GrammarBuilder::special_token(int32_t id) {
  if (id < 0 || id > kMaxTerminalId)
    DI_THROW(InvalidArgument, "special token <[", id, "]>: ids go from 0 to ", kMaxTerminalId);
  auto& v = g_.special_terminals;
  auto it = std::lower_bound(v.begin(), v.end(), id);
  if (it == v.end() || *it != id) v.insert(it, id);
  return literal(special_token_bytes(id));
}

ExprId GrammarBuilder::embed(const Grammar& g) {
  std::vector<RuleId> rules(g.rules.size());
  for (size_t r = 0; r < g.rules.size(); ++r) {
    rules[r] = declare_rule(g.rules[r].name);
    g_.rules[rules[r]].inline_ok = g.rules[r].inline_ok;
  }
  const int32_t automata0 = static_cast<int32_t>(g_.automata.size()), marks0 = static_cast<int32_t>(g_.marks.size());
  g_.automata.insert(g_.automata.end(), g.automata.begin(), g.automata.end());
  for (GrammarMark m : g.marks) {
    m.object += g_.num_tracked_objects;
    g_.marks.push_back(std::move(m));
  }
  g_.num_tracked_objects += g.num_tracked_objects;
  // Expressions are built bottom-up (children before parents), so one forward pass remaps them.
  std::vector<ExprId> exprs(g.exprs.size(), kNothingId);
  exprs[1] = kEmptyId;
  for (size_t e = 2; e < g.exprs.size(); ++e) {
    Expr x = g.exprs[e];
    for (ExprId& c : x.children) {
      DI_CHECK(c < static_cast<ExprId>(e), "grammar expression ", e, " refers to a later one");
      c = exprs[c];
    }
    if (x.kind == ExprKind::kRef) x.rule = rules[x.rule];
    if (x.kind == ExprKind::kAutomaton) x.automaton += automata0;
    if (x.mark >= 0) x.mark += marks0;
    exprs[e] = add(std::move(x));
  }
  for (size_t r = 0; r < g.rules.size(); ++r) define_rule(rules[r], exprs[g.rules[r].body]);
  for (int32_t id : g.special_terminals) special_token(id);
  return ref(rules[g.root]);
}

RuleId GrammarBuilder::declare_rule(std::string name) {
  // The first free name among name, name_2, name_3, ...: names are only ever added, so the
  // search for a base name resumes where it last stopped (schemas declare hundreds of rules).
  std::string unique = name;
  if (rule_index_.count(unique)) {
    int32_t& i = next_suffix_[name];
    for (i = std::max(i, 2);; ++i) {
      unique = name + "_" + std::to_string(i);
      if (!rule_index_.count(unique)) break;
    }
    ++i;
  }
  const RuleId id = static_cast<RuleId>(g_.rules.size());
  rule_index_.emplace(unique, id);
  g_.rules.push_back(Rule{.name = std::move(unique)});
  return id;
}

void GrammarBuilder::define_rule(RuleId r, ExprId body) { g_.rules[r].body = body; }

ExprId GrammarBuilder::ref(RuleId r) { return add(Expr{.kind = ExprKind::kRef, .rule = r}); }

RuleId GrammarBuilder::find_rule(std::string_view name) const {
  auto it = rule_index_.find(std::string(name));
  return it == rule_index_.end() ? -1 : it->second;
}

Grammar GrammarBuilder::finish(RuleId root) && {
  for (const Rule& r : g_.rules) DI_CHECK(r.body >= 0, "rule '", r.name, "' declared but never defined");
  g_.root = root;
  return std::move(g_);
}

std::string Grammar::expr_to_string(ExprId id) const {
  const Expr& e = exprs[id];
  auto byte_str = [](uint8_t b) {
    char buf[8];
    if (b >= 0x20 && b < 0x7F && b != '\\' && b != ']' && b != '-' && b != '^')
      std::snprintf(buf, sizeof buf, "%c", b);
    else
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
    return std::string(buf);
  };
  std::string out;
  switch (e.kind) {
    case ExprKind::kNothing: return "<nothing>";
    case ExprKind::kEmpty: return "\"\"";
    case ExprKind::kBytes:
      out = "[";
      for (ByteRange r : e.ranges) out += r.lo == r.hi ? byte_str(r.lo) : byte_str(r.lo) + "-" + byte_str(r.hi);
      out += "]";
      if (e.mark >= 0) {
        static const char* kNames[] = {"prefix", "add", "more", "close"};
        const GrammarMark& m = marks[e.mark];
        out += "@" + std::string(kNames[static_cast<int>(m.kind)]) + std::to_string(m.object);
        if (m.key >= 0) out += "." + std::to_string(m.key);
      }
      return out;
    case ExprKind::kSeq:
    case ExprKind::kAlt:
      out = "(";
      for (size_t i = 0; i < e.children.size(); ++i) {
        if (i) out += e.kind == ExprKind::kAlt ? " | " : " ";
        out += expr_to_string(e.children[i]);
      }
      return out + ")";
    case ExprKind::kRepeat:
      return expr_to_string(e.children[0]) + "{" + std::to_string(e.min) + "," +
             (e.max == kUnbounded ? "" : std::to_string(e.max)) + "}";
    case ExprKind::kRef: return rules[e.rule].name;
    case ExprKind::kAutomaton: return "<automaton#" + std::to_string(e.automaton) + ">";
  }
  return "?";
}

std::string Grammar::to_string() const {
  std::string out;
  for (const Rule& r : rules) out += r.name + " ::= " + expr_to_string(r.body) + "\n";
  return out;
}

}  // namespace deepinfer::structured
