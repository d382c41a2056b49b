// Structured outputs: regex, JSON schema, EBNF and choice lists compiled to per-step token masks.
//
// Flow: build a TokenVocabulary once per tokenizer; a GrammarCompiler (one per vocabulary)
// turns `so_args` into an immutable CompiledGrammar (cached by so_args, shared by all requests
// using it); each request owns a GrammarMatcher that the sampler drives every step:
//
//   matcher.fill_next_token_bitmask(words)   // bit t of words[t/32] set <=> token t allowed
//   ... sample a token t from the masked logits ...
//   matcher.accept_token(t)                  // false (and no state change) if t is not allowed
//
// so_args (one key):  {"regex": "..."}            full match, Rust/PCRE-style syntax
//                     {"json_schema": {...}|"..."} JSON Schema draft 2020-12 subset (see docs)
//                     {"json_object": true}         any JSON object
//                     {"ebnf": "..."}               GBNF (llama.cpp) grammar, root rule `root`, or Lark
//                                                   (rule `start`); both name special tokens as
//                                                   `<[id]>` (TokenizerInfo::terminal_ids), Lark
//                                                   embeds JSON schemas as `%json {...}`
//                     {"choice": ["a", "b"]}        exactly one of the strings
//                     {"schema_type": "json"|"regex"|"ebnf", "schema": ...}  DeepInfer's spelling
// optional keys:      "trigger_token_ids": [ids]  free tokens until this run of ids appears,
//                     then the grammar (DeepInfer's semantics; KMP matching over the output)
//                     "bound_token_id": id  once generated before the trigger completes, the
//                     rest of the trigger is forced token by token (needs trigger_token_ids)
//                     "whitespace": "compact" (default) | "flexible" (JSON and %json; up to
//                     "max_whitespace" (default 4) spaces/newlines/tabs between JSON tokens)
//                     "format_assertion": true (default) | false (JSON Schema `format` as annotation)
//
// Failure modes: GrammarError (include/deepinfer/error.h) for anything that does not compile,
// with the position (regex/EBNF: "line:col" or byte offset) or JSON pointer (schema) and, for
// unsupported schema keywords, the keyword's name. A supported grammar is never silently
// loosened. InvalidArgument for malformed so_args. Compilation is bounded in time and size.
#pragma once
#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::structured {

// The vocabulary as the grammar engine sees it.
struct TokenizerInfo {
  std::vector<std::string> token_bytes;  // [vocab_size] raw bytes of each token ("" = no token)
  std::vector<int32_t> stop_ids;         // end of generation (eos): allowed where the grammar may end
  std::vector<int32_t> special_ids;      // control tokens: never allowed inside a grammar
  // Special tokens a grammar may name as terminals, `<[id]>` in EBNF and Lark (DSML tool-call
  // tags, </think>): allowed exactly where a grammar names them, never elsewhere. With any
  // listed, a token whose bytes hold 0xFF (never UTF-8: no grammar text allows it anyway) is
  // never allowed, as that byte spells the terminals inside the engine. Stop ids cannot be
  // terminals (a grammar ends where they are allowed).
  std::vector<int32_t> terminal_ids;
};

// From a loaded tokenizer: stop = eos, special = every special added token except eos.
TokenizerInfo tokenizer_info_from(const Tokenizer& tok);
// One token per byte (ids 0..255) plus one stop token (id 256): for tests and byte-level checks.
TokenizerInfo byte_level_tokenizer_info();

class TokenVocabulary;  // token trie + stop/special sets (src/structured/vocab.h)
std::shared_ptr<const TokenVocabulary> make_vocabulary(TokenizerInfo info);
int32_t vocabulary_size(const TokenVocabulary& v);

// Mask caches filled ahead of the first mask. A grammar's per-state caches are otherwise
// computed by the mask call that first needs them (a "first visit": 50-300 us for a key state
// of a schema-specific object), which is most masks of a grammar used once. Right after a
// compile the request still waits for its prompt's prefill, so a worker can fill the caches of
// the states the walk reaches first in that gap (StructuredWorkers::precompute_async).
// Bounded by wall time and by the bytes of cache entries it touched; the result is the same
// cache the mask calls would have built (no decision depends on who filled it).
struct MaskPrecompute {
  double time_budget_ms = 50;          // <= 0: off
  int64_t max_cache_bytes = 16 << 20;  // stop once the filled entries hold this much
  // StructuredWorkers only: the mask cache bytes of every grammar it precomputed, together.
  // Past it the caches of the least recently precomputed or requested grammars are released
  // (CompiledGrammar::release_mask_caches), so the compiler's 256 cached grammars hold at most
  // this much rather than 256 x max_cache_bytes. 0: nothing is precomputed.
  int64_t max_total_bytes = int64_t{256} << 20;
  // time_budget_ms counts the filling thread's CPU time, not wall time. For benchmarks on a
  // shared machine (so-check --precompute-cpu): there the filling thread gets only part of a
  // core, so a wall budget fills less than a server's worker with a core of its own would.
  bool thread_cpu_budget = false;
};
struct MaskPrecomputeResult {
  int64_t states = 0;     // state caches filled or found
  int64_t pairs = 0;      // pair caches (a state over its caller's return state) filled or found
  int64_t bytes = 0;      // their size
  double ms = 0;          // wall time spent
  bool complete = false;  // every reachable state done (false: a budget ran out or cancelled)
};

struct CompiledGrammarImpl;
// Immutable after compile (its lazily filled mask caches are internally synchronised), so one
// instance may serve any number of matchers on any threads.
class CompiledGrammar {
 public:
  explicit CompiledGrammar(std::shared_ptr<CompiledGrammarImpl> impl) : impl_(std::move(impl)) {}
  std::string grammar_text() const;    // the internal grammar, EBNF-like (debugging)
  int64_t num_states() const;          // automaton states
  double compile_ms() const;
  // Fills the mask caches of the states reachable from the start, nearest first, within opts'
  // budgets; stops early once *cancel (if given) is true. Thread-safe beside mask calls.
  MaskPrecomputeResult precompute_masks(const MaskPrecompute& opts, const std::atomic<bool>* cancel = nullptr) const;
  // Bytes held by this grammar's own mask caches (state and pair entries, subtree results),
  // counting entries it shares with the vocabulary's cross-grammar cache too (an upper bound).
  int64_t mask_cache_bytes() const;
  // Drops those caches (the vocabulary's shared cache keeps its own): later masks compute the
  // entries again, equal, so no decision changes. Thread-safe beside mask calls and precomputes.
  // Returns mask_cache_bytes() just before.
  int64_t release_mask_caches() const;
  const CompiledGrammarImpl& impl() const { return *impl_; }

 private:
  std::shared_ptr<CompiledGrammarImpl> impl_;
};

struct CompilerOptions {
  double time_limit_ms = 5000;  // a compilation taking longer fails with GrammarError
  size_t cache_capacity = 256;  // compiled grammars kept (LRU-ish: oldest evicted first)
};

class GrammarCompiler {
 public:
  GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocab, CompilerOptions options = {});
  // Cached by the canonical text of so_args. Thread-safe.
  std::shared_ptr<const CompiledGrammar> compile(std::string_view so_args_json);
  // The cached grammar for so_args, or null (not compiled yet, or bad text: compile() says why).
  std::shared_ptr<const CompiledGrammar> find_cached(std::string_view so_args_json);
  // Without the cache (benchmarks measure this).
  std::shared_ptr<const CompiledGrammar> compile_uncached(std::string_view so_args_json) const;
  const std::shared_ptr<const TokenVocabulary>& vocabulary() const { return vocab_; }

 private:
  std::shared_ptr<const TokenVocabulary> vocab_;
  CompilerOptions options_;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const CompiledGrammar>> cache_;
  std::vector<std::string> cache_order_;
};

struct MatcherState;
// Per-request state. Not thread-safe; cheap to create. Copy with clone().
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;
  ~GrammarMatcher();
  GrammarMatcher clone() const;

  // Advances by one token. A stop token is accepted only where the grammar may end, and then
  // terminates the matcher. Returns false and leaves the state unchanged if not allowed
  // (including any token after termination and special tokens). Ids out of range: false.
  bool accept_token(int32_t token_id);
  // Advances by raw bytes (one rollback step). Returns false, state unchanged, if not allowed.
  bool accept_bytes(std::string_view bytes);
  // words: at least (vocab_size + 31) / 32 int32 words; every bit beyond the vocabulary is 0.
  // Never allows a token after which no completion exists.
  void fill_next_token_bitmask(std::span<int32_t> words);
  // Undoes the last n accept_token/accept_bytes calls (n <= num_accepted()).
  void rollback(int32_t n);
  int32_t num_accepted() const;
  bool is_terminated() const;  // a stop token was accepted
  bool can_terminate() const;  // the grammar may end here (a stop token would be accepted)
  // Bytes every continuation must start with (stops at a choice or where the grammar may end).
  std::string forced_bytes() const;
  // Tokens forced one at a time: while exactly one non-stop token is allowed, take it
  // (without accepting). At most max_tokens.
  std::vector<int32_t> forced_tokens(int32_t max_tokens = 16) const;
  // Masks for speculative decoding: row k (row_words words each, layout as above) is the mask
  // after accepting draft[0..k). Fills rows while the draft stays accepted, plus the row after
  // the last accepted draft token; returns the rows filled (1 + accepted draft tokens). The
  // matcher's state is unchanged on return (accepted draft tokens are rolled back).
  int32_t fill_draft_bitmasks(std::span<const int32_t> draft, std::span<int32_t> words, size_t row_words);
  void reset();

 private:
  std::unique_ptr<MatcherState> s_;
};

// Structured-output work off the engine thread: a small pool of worker threads.
//   compile_async: the grammar compiles on a worker; the request waits on the future while
//     other requests keep stepping (errors arrive as the future's exception). The compiler
//     must outlive the future.
//   fill_next_token_bitmasks: one batch's masks in parallel (rows of row_words words, row i
//     for matchers[i]; distinct matchers, each touched by one thread), the calling thread
//     working too; returns when every row is filled. Rethrows the first matcher error.
//   fill_bitmasks: the same for jobs with drafts (speculative decoding): each job's rows are
//     its matcher's fill_draft_bitmasks, `filled` the rows it filled.
struct MaskJob {
  GrammarMatcher* matcher = nullptr;
  std::span<const int32_t> draft;  // empty: one row, the next token's mask
  std::span<int32_t> words;        // (draft.size() + 1) * row_words words
  size_t row_words = 0;
  int32_t filled = 0;              // out: 1 + the draft tokens accepted
};

class StructuredWorkers {
 public:
  // precompute: what precompute_async does for each grammar (time_budget_ms <= 0: nothing).
  explicit StructuredWorkers(int threads, MaskPrecompute precompute = {});
  ~StructuredWorkers();
  StructuredWorkers(const StructuredWorkers&) = delete;
  StructuredWorkers& operator=(const StructuredWorkers&) = delete;
  int num_threads() const;
  std::shared_future<std::shared_ptr<const CompiledGrammar>> compile_async(GrammarCompiler& compiler,
                                                                         std::string so_args_json);
  // Queues g.precompute_masks(precompute) on a worker (compile_async does so after each fresh
  // compile): the caches a request's first masks need, filled while its prompt is prefilled.
  // Holds only a weak reference (a grammar dropped meanwhile is skipped) and stops when the
  // workers are destroyed. Runs only when no compile or mask helper waits: one posted while it
  // runs stops it, and it is queued again with the rest of its time budget.
  void precompute_async(const std::shared_ptr<const CompiledGrammar>& g);
  void fill_next_token_bitmasks(std::span<GrammarMatcher* const> matchers, std::span<int32_t> words,
                                size_t row_words);
  void fill_bitmasks(std::span<MaskJob> jobs);
  // The precompute ledger (MaskPrecompute::max_total_bytes): mask cache bytes of the live
  // grammars it precomputed (as measured when each precompute ended; <= the cap whenever no
  // precompute runs, else at most the cap plus their budgets), and how many grammars' caches
  // it released to stay under the cap.
  struct PrecomputeStats {
    int64_t bytes = 0;
    int64_t grammars = 0;  // live grammars in the ledger
    int64_t released = 0;
    int64_t skipped = 0;   // precomputes not run (max_total_bytes 0)
    int64_t running = 0;   // precomputes in flight
    int64_t finished = 0;  // precomputes ended (run or skipped; grammars dropped before are not counted)
  };
  PrecomputeStats precompute_stats() const;

 private:
  void run_precompute(const std::shared_ptr<const CompiledGrammar>& g, double budget_ms);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// JSON nesting allowed in so_args (deeper is InvalidArgument: walks over parsed JSON recurse
// per level). json_nesting_depth measures text without parsing (strings skipped).
inline constexpr int kMaxSoArgsDepth = 512;
int json_nesting_depth(std::string_view text);

// Parses so_args and lowers it to the internal grammar text (for tests/debugging).
std::string so_args_to_grammar_text(std::string_view so_args_json);

}  // namespace deepinfer::structured
