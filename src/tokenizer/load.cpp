// Reading tokenizer.json, tokenizer_config.json and the GPT-2 encoder.json + vocab.bpe pair.
// Every error names the file and the JSON field it came from.
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "core/file.h"
#include "core/json.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tok {
using json = nlohmann::json;

namespace {
std::string read_file(const std::string& path) { return read_regular_file_or_throw<TokenizerError>(path); }

json parse_json(const std::string& path) { return parse_json_or_throw<TokenizerError>(read_file(path), path, "malformed JSON"); }

// Typed field access with a message naming file and field. Every value read from the file goes
// through one of these, so a wrong type is a TokenizerError, never a json::type_error.
struct Ctx {
  const std::string& path;
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    DI_THROW(TokenizerError, path, ": ", field, ": ", what);
  }
  const json& get(const json& obj, const char* key, const std::string& field) const {
    if (!obj.is_object() || !obj.contains(key)) fail(field, std::string("missing field '") + key + "'");
    return obj[key];
  }
  std::string str(const json& obj, const char* key, const std::string& field) const {
    const json& v = get(obj, key, field);
    if (!v.is_string()) fail(field + "." + key, "expected a string, got " + json_snippet(v));
    return v.get<std::string>();
  }
  std::string as_str(const json& v, const std::string& field) const {
    if (!v.is_string()) fail(field, "expected a string, got " + json_snippet(v));
    return v.get<std::string>();
  }
  const json& list(const json& obj, const char* key, const std::string& field) const {
    const json& v = get(obj, key, field);
    if (!v.is_array()) fail(field + "." + key, "expected an array, got " + json_snippet(v));
    return v;
  }
  bool flag(const json& obj, const char* key, bool def) const {
    if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return def;
    if (!obj[key].is_boolean()) fail(std::string(key), "expected a boolean, got " + json_snippet(obj[key]));
    return obj[key].get<bool>();
  }
  // A token id: an integer in [0, kMaxTokenId). A negative id used to be written to tokens[id].
  int32_t id(const json& v, const std::string& field) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxTokenId ||
        (v.is_number_unsigned() && v.get<uint64_t>() >= uint64_t(kMaxTokenId)))
      fail(field, detail::str_cat("expected a token id in [0, ", kMaxTokenId, "), got ", json_snippet(v)));
    return int32_t(v.get<int64_t>());
  }
};

SplitBehavior parse_behavior(const Ctx& c, const std::string& b, const std::string& field) {
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  c.fail(field, "unknown split behavior '" + b + "'");
}

Regex parse_pattern(const Ctx& c, const json& pat, const std::string& field) {
  if (pat.is_object() && pat.contains("Regex"))
    return Regex(c.as_str(pat["Regex"], field + ".Regex"), c.path + ": " + field);
  if (pat.is_object() && pat.contains("String"))
    return Regex::literal(c.as_str(pat["String"], field + ".String"), c.path + ": " + field);
  c.fail(field, "expected {\"Regex\": ...} or {\"String\": ...}");
}

void parse_pretok(const Ctx& c, const json& j, const std::string& field, PreTokenizer& pt) {
  if (j.is_null()) return;
  std::string type = c.str(j, "type", field);
  if (pt.byte_level) c.fail(field, "pre-tokenizer '" + type + "' after ByteLevel is not supported");
  if (type == "Sequence") {
    const json& list = c.list(j, "pretokenizers", field);
    for (size_t i = 0; i < list.size(); ++i)
      parse_pretok(c, list[i], field + ".pretokenizers[" + std::to_string(i) + "]", pt);
  } else if (type == "Split") {
    pt.splits.push_back({parse_pattern(c, c.get(j, "pattern", field), field + ".pattern"),
                         parse_behavior(c, c.str(j, "behavior", field), field + ".behavior"),
                         c.flag(j, "invert", false)});
  } else if (type == "ByteLevel") {
    pt.byte_level = ByteLevelStep{c.flag(j, "add_prefix_space", false), c.flag(j, "use_regex", true)};
    if (pt.byte_level->use_regex) pt.gpt2_regex = std::make_unique<Regex>(kGpt2Pattern, "ByteLevel regex");
  } else if (type == "Digits") {
    bool individual = c.flag(j, "individual_digits", false);
    pt.splits.push_back({Regex(individual ? "\\p{N}" : "\\p{N}+", field), SplitBehavior::kIsolated, false});
  } else if (type == "Whitespace") {
    pt.splits.push_back({Regex("\\w+|[^\\w\\s]+", field), SplitBehavior::kRemoved, true});
  } else if (type == "WhitespaceSplit") {
    pt.splits.push_back({Regex("\\s+", field), SplitBehavior::kRemoved, false});
  } else {
    c.fail(field, "unsupported pre_tokenizer type '" + type + "'");
  }
}

void parse_normalizer(const Ctx& c, const json& j, const std::string& field, Normalizer& n) {
  if (j.is_null()) return;
  std::string type = c.str(j, "type", field);
  if (type == "Sequence") {
    const json& list = c.list(j, "normalizers", field);
    for (size_t i = 0; i < list.size(); ++i)
      parse_normalizer(c, list[i], field + ".normalizers[" + std::to_string(i) + "]", n);
  } else if (type == "Prepend") {
    n.steps.push_back({NormalizerStep::kPrepend, c.str(j, "prepend", field), nullptr});
  } else if (type == "Replace") {
    auto re = std::make_unique<Regex>(parse_pattern(c, c.get(j, "pattern", field), field + ".pattern"));
    n.steps.push_back({NormalizerStep::kReplace, c.str(j, "content", field), std::move(re)});
  } else if (type == "Strip") {
    if (c.flag(j, "strip_left", true)) n.steps.push_back({NormalizerStep::kStripLeft, "", nullptr});
    if (c.flag(j, "strip_right", true)) n.steps.push_back({NormalizerStep::kStripRight, "", nullptr});
  } else {
    c.fail(field, "unsupported normalizer type '" + type + "'");
  }
}

void parse_decoder(const Ctx& c, const json& j, const std::string& field) {
  if (j.is_null()) return;  // decoded as byte-level anyway
  std::string type = c.str(j, "type", field);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = c.list(j, "decoders", field);
    for (size_t i = 0; i < list.size(); ++i) parse_decoder(c, list[i], field + ".decoders[" + std::to_string(i) + "]");
    return;
  }
  c.fail(field, "unsupported decoder type '" + type + "' (byte-level tokenizers use ByteLevel)");
}

int32_t special_id(const Ctx& c, const json& specials, const std::string& name, const std::string& field) {
  if (!specials.contains(name)) c.fail(field, "special token '" + name + "' not listed in special_tokens");
  const json& ids = c.list(specials[name], "ids", field + ".special_tokens." + name);
  if (ids.size() != 1) c.fail(field, "special token '" + name + "' must map to exactly one id");
  return c.id(ids[0], field + ".special_tokens." + name + ".ids[0]");
}

void parse_post(const Ctx& c, const json& j, const std::string& field, Tokenizer::Impl& impl) {
  if (j.is_null()) return;
  std::string type = c.str(j, "type", field);
  auto token_id = [&](const json& pair, const std::string& f) {
    if (!pair.is_array() || pair.size() != 2) c.fail(f, "expected [token, id]");
    return c.id(pair[1], f + "[1]");
  };
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    const json& list = c.list(j, "processors", field);
    for (size_t i = 0; i < list.size(); ++i) parse_post(c, list[i], field + ".processors[" + std::to_string(i) + "]", impl);
  } else if (type == "TemplateProcessing") {
    const json& single = c.list(j, "single", field);
    const json& specials = c.get(j, "special_tokens", field);
    bool seen_seq = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& piece = single[i];
      std::string f = field + ".single[" + std::to_string(i) + "]";
      if (piece.contains("Sequence")) {
        seen_seq = true;
      } else if (piece.contains("SpecialToken")) {
        int32_t id = special_id(c, specials, c.str(piece["SpecialToken"], "id", f), field);
        (seen_seq ? impl.post_suffix : impl.post_prefix).push_back(id);
      } else {
        c.fail(f, "expected Sequence or SpecialToken");
      }
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    impl.post_prefix.push_back(token_id(c.get(j, "cls", field), field + ".cls"));
    impl.post_suffix.push_back(token_id(c.get(j, "sep", field), field + ".sep"));
  } else {
    c.fail(field, "unsupported post_processor type '" + type + "'");
  }
}

// Fills tokens/bytes of the model vocabulary (byte-level strings -> raw bytes).
void add_vocab(const Ctx& c, Tokenizer::Impl& impl, const json& vocab, const std::string& field) {
  if (!vocab.is_object()) c.fail(field, "expected an object token -> id");
  const ByteAlphabet& ab = ByteAlphabet::get();
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    max_id = std::max(max_id, c.id(it.value(), field + "[\"" + it.key() + "\"]"));
  impl.tokens.resize(max_id + 1);
  impl.bytes.resize(max_id + 1);
  impl.flags.resize(max_id + 1, 0);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    std::string raw;
    if (!ab.decode(it.key(), raw)) raw = it.key();  // outside the alphabet: HF's decoder keeps the UTF-8
    impl.set_token(it.value().get<int32_t>(), it.key(), raw, Tokenizer::Impl::kPresent);
  }
}

// merges: ["a b", ...] or [["a", "b"], ...]; rank = position.
void add_merges(const Ctx& c, Tokenizer::Impl& impl, const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<MergeTable::Entry> entries;
  entries.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto ia = impl.token_to_id.find(a), ib = impl.token_to_id.find(b), iab = impl.token_to_id.find(a + b);
    std::string field = "model.merges[" + std::to_string(r) + "]";
    if (ia == impl.token_to_id.end() || ib == impl.token_to_id.end())
      c.fail(field, "merge '" + a + " " + b + "' names a token missing from the vocabulary");
    if (iab == impl.token_to_id.end()) c.fail(field, "merge result '" + a + b + "' missing from the vocabulary");
    uint64_t key = (uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second);
    entries.push_back({key, int32_t(r), iab->second});
  }
  impl.bpe.merges.build(entries);
}

void init_bytes(const Ctx& c, Tokenizer::Impl& impl) {
  const ByteAlphabet& ab = ByteAlphabet::get();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, ab.byte_to_cp[b]);
    auto it = impl.token_to_id.find(s);
    impl.bpe.byte_to_id[b] = it == impl.token_to_id.end() ? -1 : it->second;
  }
  for (int32_t id = 0; id < impl.vocab_size(); ++id)
    if ((impl.flags[id] & Tokenizer::Impl::kPresent) && !(impl.flags[id] & Tokenizer::Impl::kAdded))
      impl.bpe.bytes_to_id.emplace(impl.bytes[id], id);
}
}  // namespace

std::unique_ptr<Tokenizer::Impl> load_tokenizer_json(const std::string& path) {
  json j = parse_json(path);
  Ctx c{path};
  if (!j.is_object()) c.fail("<root>", "expected a JSON object");
  auto impl = std::make_unique<Tokenizer::Impl>();
  impl->source = path;

  const json& model = c.get(j, "model", "<root>");
  std::string mtype = model.contains("type") ? c.str(model, "type", "model") : "BPE";
  if (mtype != "BPE") c.fail("model.type", "unsupported model type '" + mtype + "' (only byte-level BPE)");
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      (!model["dropout"].is_number() || model["dropout"].get<double>() != 0))
    c.fail("model.dropout", "BPE dropout is not supported (got " + json_snippet(model["dropout"]) + ")");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
      c.fail(std::string("model.") + k, "not supported for byte-level BPE");
  impl->bpe.ignore_merges = c.flag(model, "ignore_merges", false);

  parse_normalizer(c, j.value("normalizer", json()), "normalizer", impl->normalizer);
  parse_pretok(c, j.value("pre_tokenizer", json()), "pre_tokenizer", impl->pretok);
  if (!impl->pretok.byte_level)
    c.fail("pre_tokenizer", "no ByteLevel step: only byte-level BPE tokenizers are supported");
  parse_decoder(c, j.value("decoder", json()), "decoder");
  parse_post(c, j.value("post_processor", json()), "post_processor", *impl);

  add_vocab(c, *impl, c.get(model, "vocab", "model"), "model.vocab");
  const json& mj = c.list(model, "merges", "model");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(mj.size());
  for (size_t r = 0; r < mj.size(); ++r) {
    const json& m = mj[r];
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) c.fail("model.merges[" + std::to_string(r) + "]", "expected 'a b'");
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      c.fail("model.merges[" + std::to_string(r) + "]", "expected 'a b' or [a, b]");
    }
  }
  add_merges(c, *impl, merges);

  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    const json& at = j["added_tokens"];
    if (!at.is_array()) c.fail("added_tokens", "expected an array, got " + json_snippet(at));
    for (size_t i = 0; i < at.size(); ++i) {
      std::string f = "added_tokens[" + std::to_string(i) + "]";
      const json& t = at[i];
      AddedToken a;
      a.id = c.id(c.get(t, "id", f), f + ".id");
      a.content = c.str(t, "content", f);
      a.special = c.flag(t, "special", false);
      a.lstrip = c.flag(t, "lstrip", false);
      a.rstrip = c.flag(t, "rstrip", false);
      a.single_word = c.flag(t, "single_word", false);
      a.normalized = c.flag(t, "normalized", !a.special);
      if (find_invalid_utf8(a.content) != std::string::npos) c.fail(f + ".content", "invalid UTF-8");
      impl->added.push_back(a);
    }
  }
  impl->finalize();
  // The post-processor names its ids directly; they must be tokens of this vocabulary (found by
  // the fuzzer: an id past the vocabulary was emitted by encode(add_special_tokens=true)).
  for (const auto* ids : {&impl->post_prefix, &impl->post_suffix})
    for (int32_t id : *ids)
      if (id >= impl->vocab_size() || !(impl->flags[size_t(id)] & Tokenizer::Impl::kPresent))
        c.fail("post_processor", detail::str_cat("token id ", id, " is not a token of the vocabulary (size ",
                                                 impl->vocab_size(), ")"));
  init_bytes(c, *impl);
  return impl;
}

std::unique_ptr<Tokenizer::Impl> load_gpt2(const std::string& encoder_json, const std::string& vocab_bpe) {
  json enc = parse_json(encoder_json);
  Ctx c{encoder_json};
  auto impl = std::make_unique<Tokenizer::Impl>();
  impl->source = encoder_json;
  impl->pretok.byte_level = ByteLevelStep{false, true};
  impl->pretok.gpt2_regex = std::make_unique<Regex>(kGpt2Pattern, "ByteLevel regex");
  add_vocab(c, *impl, enc, "<root>");

  std::string text = read_file(vocab_bpe);
  Ctx cb{vocab_bpe};
  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream in(text);
  std::string line;
  for (size_t lineno = 1; std::getline(in, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    size_t sp = line.find(' ', 1);
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
      cb.fail("line " + std::to_string(lineno), "expected two tokens separated by one space");
    merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  add_merges(cb, *impl, merges);
  // GPT2TokenizerFast registers <|endoftext|> as a special added token (bos = eos = it).
  auto it = impl->token_to_id.find("<|endoftext|>");
  if (it != impl->token_to_id.end()) {
    impl->added.push_back({it->second, "<|endoftext|>", true, false, false, false, false});
    impl->bos = impl->eos = it->second;
    impl->bos_text = impl->eos_text = "<|endoftext|>";
  }
  impl->finalize();
  init_bytes(c, *impl);
  return impl;
}

void load_tokenizer_config(const std::string& path, Tokenizer::Impl& impl) {
  json j = parse_json(path);
  Ctx c{path};
  if (!j.is_object()) c.fail("<root>", "expected a JSON object");
  auto token_of = [&](const char* key, std::optional<int32_t>& id, std::string& text) {
    if (!j.contains(key) || j[key].is_null()) return;
    const json& v = j[key];
    std::string s = v.is_string() ? v.get<std::string>() : c.str(v, "content", key);
    auto it = impl.token_to_id.find(s);
    if (it == impl.token_to_id.end()) c.fail(key, "token '" + s + "' is not in the vocabulary");
    id = it->second;
    text = s;
  };
  token_of("bos_token", impl.bos, impl.bos_text);
  token_of("eos_token", impl.eos, impl.eos_text);
  impl.add_bos = c.flag(j, "add_bos_token", false);
  impl.add_eos = c.flag(j, "add_eos_token", false);
  if (impl.add_bos && !impl.bos) c.fail("add_bos_token", "set but no bos_token is given");
}

}  // namespace deepinfer::tok
