// deepinfer::LLM from several threads: concurrent generate() calls share the engine and get
// exactly the outputs they would get alone; aborts from another thread end the request
// finished; should_cancel stops a call and frees its requests; ids never repeat; generate()
// works inside an add_request/step loop. (Also the TSan target of tools/sanitizers.sh.)
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "deepinfer/llm.h"

using namespace deepinfer;

namespace {
LLMConfig toy() {
  LLMConfig c;
  c.model = "builtin:toy";
  c.max_num_batched_tokens = 64;
  return c;
}

SamplingParams seeded(int n_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.max_tokens = n_tokens;
  p.ignore_eos = true;
  p.seed = seed;
  return p;
}

PromptInput prompt(int i) { return PromptInput::from_text("prompt number " + std::to_string(i)); }
}  // namespace

TEST(LlmThreads, ConcurrentGenerateEqualsAlone) {
  LLM llm(toy());
  constexpr int kThreads = 4, kPerThread = 3, kRounds = 3;
  std::vector<std::vector<int32_t>> want(kThreads * kPerThread);
  for (int i = 0; i < kThreads * kPerThread; ++i)
    want[i] = llm.generate({prompt(i)}, {seeded(20, 100 + i)})[0].outputs[0].token_ids;
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        std::vector<PromptInput> ps;
        std::vector<SamplingParams> sp;
        for (int k = 0; k < kPerThread; ++k) ps.push_back(prompt(t * kPerThread + k)), sp.push_back(seeded(20, 100 + t * kPerThread + k));
        auto outs = llm.generate(ps, sp);
        for (int k = 0; k < kPerThread; ++k)
          if (!outs[k].finished || outs[k].outputs.empty() || outs[k].outputs[0].token_ids != want[t * kPerThread + k])
            failures[t] += "request " + std::to_string(t * kPerThread + k) + " differs; ";
      }
    });
  for (auto& th : threads) th.join();
  for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;
  EXPECT_FALSE(llm.has_unfinished());
}

TEST(LlmThreads, AbortFromAnotherThreadEndsFinished) {
  LLM llm(toy());
  const std::string victim = std::to_string(std::stoll(llm.reserve_request_id()) + 1);
  SamplingParams longp = seeded(int(llm.max_model_len()) - 16, 1), shortp = seeded(6, 2);
  // The generating thread pauses in its first callback for the victim until the abort is done,
  // so the abort lands mid-generation deterministically (callbacks run outside the engine lock).
  std::promise<void> running, aborted;
  std::shared_future<void> aborted_f = aborted.get_future().share();
  bool signalled = false;
  GenerateOptions o;
  o.on_output = [&](const RequestOutput& r) {
    if (r.request_id != victim || signalled) return;
    signalled = true;
    running.set_value();
    aborted_f.wait();
  };
  std::vector<RequestOutput> outs;
  std::thread t([&] { outs = llm.generate({prompt(0), prompt(1)}, {longp, shortp}, o); });
  running.get_future().wait();
  llm.abort_request(victim);
  aborted.set_value();
  t.join();
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].request_id, victim);
  EXPECT_TRUE(outs[0].finished);
  ASSERT_EQ(outs[0].outputs.size(), 1u);
  EXPECT_EQ(outs[0].outputs[0].finish_reason, "abort");
  EXPECT_LT(outs[0].outputs[0].token_ids.size(), size_t(*longp.max_tokens));
  EXPECT_EQ(outs[1].outputs[0].finish_reason, "length");
  EXPECT_FALSE(llm.has_unfinished());
}

TEST(LlmThreads, ShouldCancelAbortsThisCallOnly) {
  LLM llm(toy());
  // A stream request that must survive the other call's cancellation.
  std::string streamed = llm.add_request(prompt(7), seeded(30, 7));
  std::atomic<int> polls{0};
  GenerateOptions o;
  o.should_cancel = [&] { return ++polls > 5; };
  auto t0 = std::chrono::steady_clock::now();
  auto outs = llm.generate({prompt(0), prompt(1)}, {seeded(int(llm.max_model_len()) - 16, 3)}, o);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  for (const auto& r : outs) {
    EXPECT_TRUE(r.finished);
    EXPECT_EQ(r.outputs.at(0).finish_reason, "abort");
  }
  std::vector<int32_t> got;
  bool finished = false;
  while (!finished) {
    for (const RequestOutput& r : llm.step()) {
      ASSERT_EQ(r.request_id, streamed);
      got = r.outputs[0].token_ids;
      finished = r.finished;
    }
  }
  EXPECT_EQ(got, llm.generate({prompt(7)}, {seeded(30, 7)})[0].outputs[0].token_ids);
  EXPECT_FALSE(llm.has_unfinished());
}

TEST(LlmThreads, GenerateInsideAStepLoopAndUniqueIds) {
  LLM llm(toy());
  std::set<std::string> ids;
  std::string a = llm.add_request(prompt(1), seeded(12, 1));
  ids.insert(a);
  const auto want_inner = llm.generate({prompt(2)}, {seeded(5, 2)})[0].outputs[0].token_ids;
  int steps = 0;
  bool done = false;
  while (!done) {
    for (const RequestOutput& r : llm.step()) {
      EXPECT_EQ(r.request_id, a);
      done = r.finished;
    }
    if (++steps == 3) {
      auto inner = llm.generate({prompt(2), PromptInput::from_text("")}, {seeded(5, 2)});
      EXPECT_EQ(inner[0].outputs.at(0).token_ids, want_inner);
      EXPECT_FALSE(inner[1].error.empty());
      for (const auto& r : inner) EXPECT_TRUE(ids.insert(r.request_id).second) << r.request_id;
    }
  }
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(ids.insert(llm.reserve_request_id()).second);
  EXPECT_FALSE(llm.has_unfinished());
}

TEST(LlmThreads, ConcurrentStructuredRequestsShareGrammars) {
  // One compiled grammar (cached by so_args) and its lazily filled mask caches serve requests
  // of several threads at once; each output still equals its run alone.
  LLM llm(toy());
  auto constrained = [](int i) {
    SamplingParams p = seeded(24, 50 + i);
    p.ignore_eos = false;
    StructuredOutputsParams so;
    if (i % 2) so.regex = "(ab|cd)+x[0-9]{1,3}";
    else so.json = R"({"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]})";
    p.structured_outputs = so;
    return p;
  };
  constexpr int kThreads = 4;
  std::vector<std::string> want(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    auto o = llm.generate({prompt(i)}, {constrained(i)})[0];
    ASSERT_TRUE(o.error.empty()) << o.error;
    want[i] = o.outputs[0].text;
    EXPECT_GE(want[i].size(), 3u) << "request " << i << ": " << want[i];
    if (i % 2) EXPECT_TRUE(want[i].find('x') != std::string::npos) << want[i];
    else EXPECT_EQ(want[i].rfind("{\"", 0), 0u) << want[i];
  }
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 3; ++r) {
        auto o = llm.generate({prompt(t)}, {constrained(t)})[0];
        if (!o.error.empty() || o.outputs.at(0).text != want[t]) failures[t] += "round " + std::to_string(r) + "; ";
      }
    });
  for (auto& th : threads) th.join();
  for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;
}

TEST(LlmThreads, StreamGenerateAndAbortAtOnce) {
  // Every entry point at once (the engine-level TSan case of tools/sanitizers.sh tsan): one
  // thread drives an add_request/step stream, two threads call generate(), a fourth aborts half
  // of the streamed requests while they run and polls has_unfinished(). Each output equals its
  // run alone; an aborted request ends finished with a prefix of it (or, when the abort came
  // after its end, the whole of it).
  LLM llm(toy());
  constexpr int kStreamed = 4, kCalls = 4, kTokens = 16;
  std::vector<std::vector<int32_t>> want(kStreamed + kCalls);
  for (int i = 0; i < kStreamed + kCalls; ++i)
    want[i] = llm.generate({prompt(i)}, {seeded(kTokens, 200 + i)})[0].outputs[0].token_ids;
  std::vector<std::string> stream_ids;
  std::map<std::string, RequestOutput> last;
  std::promise<void> queued;
  std::thread streamer([&] {
    for (int i = 0; i < kStreamed; ++i) stream_ids.push_back(llm.add_request(prompt(i), seeded(kTokens, 200 + i)));
    queued.set_value();
    int done = 0;
    for (int steps = 0; done < kStreamed && steps < 10000; ++steps)
      for (const RequestOutput& r : llm.step()) {
        last[r.request_id] = r;
        done += r.finished;
      }
  });
  queued.get_future().wait();
  std::thread aborter([&] {
    for (int i = 0; i < kStreamed; i += 2) {
      llm.abort_request(stream_ids[i]);
      (void)llm.has_unfinished();
      std::this_thread::yield();
    }
  });
  std::vector<std::string> failures(2);
  std::vector<std::thread> callers;
  for (int c = 0; c < 2; ++c)
    callers.emplace_back([&, c] {
      for (int k = 0; k < kCalls / 2; ++k) {
        const int i = kStreamed + 2 * c + k;
        RequestOutput o = llm.generate({prompt(i)}, {seeded(kTokens, 200 + i)})[0];
        if (!o.finished || o.outputs.empty() || o.outputs[0].token_ids != want[i])
          failures[c] += "request " + std::to_string(i) + " differs; ";
      }
    });
  for (auto& th : callers) th.join();
  aborter.join();
  streamer.join();
  for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;
  ASSERT_EQ(last.size(), size_t(kStreamed));
  for (int i = 0; i < kStreamed; ++i) {
    const RequestOutput& r = last.at(stream_ids[i]);
    ASSERT_TRUE(r.finished) << i;
    ASSERT_EQ(r.outputs.size(), 1u) << i;
    const auto& got = r.outputs[0].token_ids;
    if (i % 2 == 0 && r.outputs[0].finish_reason == "abort") {
      ASSERT_LE(got.size(), want[i].size()) << i;
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want[i].begin())) << "aborted request " << i << " is not a prefix";
    } else {
      EXPECT_EQ(r.outputs[0].finish_reason, "length") << i;
      EXPECT_EQ(got, want[i]) << "request " << i;
    }
  }
  EXPECT_FALSE(llm.has_unfinished());
}
