// Grammars off the engine's critical path (issue #19 item 6): a request whose grammar is still
// compiling waits outside the scheduler while the others step (checked by step counts, with a
// compile held by a gate the test opens), its output is the one a synchronous compile gives, a
// compile error found later ends only that request with its error, and a batch's masks (with
// drafts) filled on the compiler's workers equal the ones filled one matcher at a time.
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <regex>

#include "deepinfer/error.h"
#include "engine/engine.h"
#include "engine/toy_drafter.h"
#include "engine/toy_model.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
StructuredOutputsParams regex(std::string r) {
  StructuredOutputsParams s;
  s.regex = std::move(r);
  return s;
}

SamplingParams greedy(int n, std::optional<StructuredOutputsParams> so = std::nullopt) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  p.structured_outputs = std::move(so);
  return p;
}

// The structured compiler, except that grammars whose regex starts with "(slow)" stay
// "compiling" until open() (the compile itself then runs in make_matcher).
class GatedCompiler final : public GrammarCompiler {
 public:
  explicit GatedCompiler(std::unique_ptr<GrammarCompiler> inner) : inner_(std::move(inner)), gate_(open_.get_future().share()) {}
  void open() { open_.set_value(); }
  std::unique_ptr<GrammarMatcher> compile(const StructuredOutputsParams& spec) override { return inner_->compile(spec); }
  std::shared_ptr<PendingGrammar> compile_async(const StructuredOutputsParams& spec) override {
    if (spec.regex && spec.regex->rfind("(slow)", 0) == 0) return std::make_shared<Gated>(*inner_, spec, gate_);
    return inner_->compile_async(spec);
  }
  void fill_bitmasks(std::span<const GrammarMaskJob> jobs) override { inner_->fill_bitmasks(jobs); }
  int64_t num_distinct_grammars() const override { return inner_->num_distinct_grammars(); }

 private:
  struct Gated final : PendingGrammar {
    Gated(GrammarCompiler& c, StructuredOutputsParams s, std::shared_future<void> g) : c(c), spec(std::move(s)), gate(std::move(g)) {}
    bool ready() const override { return wait_for(0); }
    bool wait_for(double s) const override {
      return gate.wait_for(std::chrono::duration<double>(s)) == std::future_status::ready;
    }
    std::unique_ptr<GrammarMatcher> make_matcher() const override {
      gate.wait();
      return c.compile(spec);
    }
    GrammarCompiler& c;
    StructuredOutputsParams spec;
    std::shared_future<void> gate;
  };
  std::unique_ptr<GrammarCompiler> inner_;
  std::promise<void> open_;
  std::shared_future<void> gate_;
};

struct AsyncSetup {
  double wait_s = 0.05;
  int32_t drafts = 0;
  bool gated = false;
};

struct Harness {
  std::unique_ptr<Engine> eng;
  GatedCompiler* gate = nullptr;
  explicit Harness(const AsyncSetup& s) {
    ToyModelConfig tc;
    tc.max_rollback = 5;
    auto model = std::make_unique<ToyModel>(tc);
    if (s.drafts > 0) model->set_drafter(std::make_unique<ToyDrafter>(tc, s.drafts, [](int64_t step) { return int32_t(step % 3); }));
    EngineConfig ec;
    ec.scheduler.max_num_seqs = 8;
    ec.num_speculative_tokens = s.drafts;
    ec.grammar_compile_wait_s = s.wait_s;
    auto codec = make_toy_codec(tc.vocab_size);
    std::unique_ptr<GrammarCompiler> g = make_grammar_compiler(codec.get(), tc.vocab_size, 1, 2);
    if (g && s.gated) {
      auto gc = std::make_unique<GatedCompiler>(std::move(g));
      gate = gc.get();
      g = std::move(gc);
    }
    eng = std::make_unique<Engine>(ec, std::move(model), std::move(codec), std::move(g));
  }
  bool available() const { return eng->grammar() != nullptr; }
  // Steps until `id` finishes (or everything does when id is ""); returns the steps taken.
  int64_t run(std::map<std::string, RequestOutput>& out, const std::string& id = "") {
    int64_t steps = 0;
    while (eng->has_unfinished() && (id.empty() || !out.count(id))) {
      for (RequestOutput& o : eng->step())
        if (o.finished) out[o.request_id] = std::move(o);
      ++steps;
    }
    return steps;
  }
};

PromptInput prompt(const std::string& text) {
  std::vector<int32_t> ids = {0};
  for (unsigned char c : text) ids.push_back(2 + int32_t(c));
  return PromptInput::from_token_ids(ids);
}
}  // namespace

TEST(GrammarAsync, SlowCompileDoesNotDelayOtherRequests) {
  // B alone: how many steps it takes, and its tokens.
  Harness solo(AsyncSetup{.gated = true});
  if (!solo.available()) GTEST_SKIP() << "structured module not in this build";
  std::map<std::string, RequestOutput> alone;
  solo.eng->add_request("b", prompt("hello"), greedy(12, regex("(ab)+c?")), 0);
  const int64_t b_steps = solo.run(alone);
  ASSERT_TRUE(alone.count("b") && alone["b"].error.empty());

  // A's grammar is held compiling; B runs beside it in exactly as many steps.
  Harness h(AsyncSetup{.gated = true});
  std::map<std::string, RequestOutput> out;
  h.eng->add_request("a", prompt("abc"), greedy(12, regex("(slow)[0-9]{3}-[a-z]{2}")), 0);
  EXPECT_EQ(h.eng->num_compiling(), 1);
  h.eng->add_request("b", prompt("hello"), greedy(12, regex("(ab)+c?")), 0);
  EXPECT_EQ(h.run(out, "b"), b_steps) << "the compiling request delayed another one's steps";
  ASSERT_TRUE(out.count("b"));
  EXPECT_EQ(out["b"].outputs[0].token_ids, alone["b"].outputs[0].token_ids);
  EXPECT_FALSE(out.count("a"));
  EXPECT_EQ(h.eng->num_compiling(), 1);
  EXPECT_TRUE(h.eng->has_unfinished());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(h.eng->step().empty()) << "nothing to run while only a compile is left";

  // Compiled: A runs and gives what a synchronous compile gives.
  h.gate->open();
  h.run(out);
  EXPECT_EQ(h.eng->num_compiling(), 0);
  Harness sync(AsyncSetup{.wait_s = 60});
  std::map<std::string, RequestOutput> ref;
  sync.eng->add_request("a", prompt("abc"), greedy(12, regex("(slow)[0-9]{3}-[a-z]{2}")), 0);
  sync.run(ref);
  ASSERT_TRUE(out.count("a") && ref.count("a"));
  ASSERT_EQ(out["a"].error, "");
  EXPECT_TRUE(std::regex_match(out["a"].outputs[0].text, std::regex("slow[0-9]{3}-[a-z]{2}"))) << out["a"].outputs[0].text;
  EXPECT_EQ(out["a"].outputs[0].token_ids, ref["a"].outputs[0].token_ids);
  EXPECT_EQ(out["a"].outputs[0].finish_reason, ref["a"].outputs[0].finish_reason);
}

TEST(GrammarAsync, LateCompileErrorEndsOnlyThatRequest) {
  Harness h(AsyncSetup{.gated = true});
  if (!h.available()) GTEST_SKIP() << "structured module not in this build";
  h.eng->add_request("bad", prompt("x"), greedy(8, regex("(slow)[0-9")), 0);  // no throw: still compiling
  h.eng->add_request("good", prompt("x"), greedy(8), 0);
  std::map<std::string, RequestOutput> out;
  h.run(out, "good");
  h.gate->open();
  h.run(out);
  ASSERT_TRUE(out.count("bad"));
  EXPECT_TRUE(out["bad"].finished);
  EXPECT_NE(out["bad"].error.find("regex"), std::string::npos) << out["bad"].error;
  EXPECT_TRUE(out["bad"].outputs.empty());
  EXPECT_EQ(out["good"].error, "");
  EXPECT_FALSE(h.eng->has_unfinished());
  // A synchronous compile (done within the wait) still throws from add_request.
  EXPECT_THROW(h.eng->add_request("bad2", prompt("x"), greedy(8, regex("[0-9")), 0), GrammarError);
}

TEST(GrammarAsync, AbortWhileCompiling) {
  Harness h(AsyncSetup{.gated = true});
  if (!h.available()) GTEST_SKIP() << "structured module not in this build";
  h.eng->add_request("a", prompt("x"), greedy(8, regex("(slow)a+")), 0);
  std::vector<RequestOutput> o = h.eng->abort("a");
  ASSERT_EQ(o.size(), 1u);
  EXPECT_TRUE(o[0].finished);
  ASSERT_EQ(o[0].outputs.size(), 1u);
  EXPECT_EQ(o[0].outputs[0].finish_reason, "abort");
  EXPECT_FALSE(h.eng->has_unfinished());
  EXPECT_EQ(h.eng->num_compiling(), 0);
  h.gate->open();
}

// Every request compiled asynchronously (wait 0) vs synchronously, plain and with drafts: the
// same tokens.
TEST(GrammarAsync, AsyncCompileGivesSynchronousOutputs) {
  std::vector<SamplingParams> ps;
  ps.push_back(greedy(16, regex("[0-9]{3}-[a-z]{2}")));
  StructuredOutputsParams js;
  js.json = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"enum":["x","yy"]}},"required":["a","b"]})";
  ps.push_back(greedy(24, js));
  StructuredOutputsParams ch;
  ch.choice = std::vector<std::string>{"yes", "no", "maybe"};
  ps.push_back(greedy(8, ch));
  ps.push_back(greedy(10));
  for (int32_t drafts : {0, 3}) {
    std::map<std::string, RequestOutput> got[2];
    for (int mode = 0; mode < 2; ++mode) {
      Harness h(AsyncSetup{.wait_s = mode ? 60.0 : 0.0, .drafts = drafts});
      if (!h.available()) GTEST_SKIP() << "structured module not in this build";
      for (size_t i = 0; i < 8; ++i)
        h.eng->add_request(std::to_string(i), prompt("p" + std::to_string(i)), ps[i % ps.size()], 0);
      h.run(got[mode]);
    }
    ASSERT_EQ(got[0].size(), 8u);
    for (auto& [id, o] : got[1]) {
      ASSERT_EQ(o.error, "") << id;
      ASSERT_EQ(got[0][id].error, "") << id;
      EXPECT_EQ(got[0][id].outputs[0].token_ids, o.outputs[0].token_ids) << "request " << id << ", drafts " << drafts;
    }
  }
}

// fill_bitmasks over a batch (workers) equals each matcher's own masks, drafts included, and
// leaves every matcher where it was.
TEST(GrammarAsync, BatchMasksEqualOneAtATime) {
  auto codec = make_toy_codec(320);
  auto c = make_grammar_compiler(codec.get(), 320, 1, 3);
  if (!c) GTEST_SKIP() << "structured module not in this build";
  const size_t words = 10;
  std::vector<std::unique_ptr<GrammarMatcher>> ms;
  std::vector<std::vector<int32_t>> drafts;
  for (int i = 0; i < 9; ++i) {
    ms.push_back(c->compile(regex(i % 2 ? "[0-9]{2,5}(x|yz)" : "(ab|abc)+d")));
    drafts.push_back(i % 3 == 0 ? std::vector<int32_t>{} : i % 2 ? std::vector<int32_t>{2 + '1', 2 + '2', 2 + '3'}
                                                                 : std::vector<int32_t>{2 + 'a', 2 + 'b'});
  }
  std::vector<std::vector<std::vector<uint32_t>>> rows(ms.size()), ref(ms.size());
  std::vector<GrammarMaskJob> jobs;
  for (size_t i = 0; i < ms.size(); ++i) {
    rows[i].assign(drafts[i].size() + 1, std::vector<uint32_t>(words, 0xFFFFFFFFu));
    ref[i].assign(drafts[i].size() + 1, std::vector<uint32_t>(words, 0));
    jobs.push_back({ms[i].get(), drafts[i], &rows[i]});
  }
  c->fill_bitmasks(jobs);
  for (size_t i = 0; i < ms.size(); ++i) {
    ms[i]->GrammarMatcher::fill_bitmasks(drafts[i], ref[i]);  // the base class's accept/fill/rollback
    EXPECT_EQ(rows[i], ref[i]) << "matcher " << i;
    std::vector<uint32_t> now(words, 0), first(words, 0);
    ms[i]->fill_bitmask(now);
    EXPECT_EQ(now, ref[i][0]) << "matcher " << i << " moved";
  }
  // A draft the grammar rejects is an internal error, the matcher unchanged.
  std::vector<int32_t> bad = {2 + 'a', 2 + 'q'};
  std::vector<std::vector<uint32_t>> r2(3, std::vector<uint32_t>(words, 0));
  GrammarMaskJob j{ms[0].get(), bad, &r2};
  EXPECT_THROW(c->fill_bitmasks(std::span<const GrammarMaskJob>(&j, 1)), InternalError);
  EXPECT_TRUE(ms[0]->accept_token(2 + 'a'));
}
