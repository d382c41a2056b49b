// Prefill/decode disaggregation end to end, in-process on the slowed toy model: a prefill server
// and a decode server joined by the KV transport (gloo over loopback, a fresh rendezvous
// directory), a router in front with --prefill / --decode. Greedy outputs equal a single
// colocated server's, including when the prefill server's own prefix cache hits; the decode
// server reports the imported prefix as cached prompt tokens; a request that cannot be
// disaggregated (n = 2) or whose transfer is refused still answers correctly. Also the KV
// bundle codec against truncated and inconsistent input.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "core/env.h"
#include "engine/engine.h"
#include "engine/engine_factory.h"
#include "engine/kv_transfer.h"
#include "parallel/gloo_group.h"
#include "router/router.h"
#include "router_test_util.h"

namespace deepinfer::router {
namespace {
using namespace testing;
namespace fs = std::filesystem;

std::unique_ptr<server::Server> start_kv_server(const std::string& role, const std::string& dir, const std::string& name,
                                                const std::string& peer) {
  ReplicaOptions ro{.max_num_seqs = 4, .base_ms = 1, .per_token_us = 5};
  server::KvTransportOptions kv{.role = role, .rendezvous_dir = dir, .name = name, .peers = {peer}};
  kv.connect_timeout_s = 60;
  kv.heartbeat_s = 0.2;
  return start_replica(ro, kv);
}

json greedy(const std::string& prompt, int max_tokens, bool stream = false, int n = 1) {
  json j = {{"model", "toy"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
  if (stream) j["stream"] = true;
  if (n > 1) j["n"] = n;
  return j;
}

std::string text_of(const Reply& r) {
  const json j = r.j();
  if (j.contains("choices")) return j["choices"][0]["text"];
  std::string out;  // a stream
  for (const std::string& e : sse_events(r.body))
    if (e != "[DONE]") out += json::parse(e)["choices"][0]["text"].get<std::string>();
  return out;
}

TEST(Disagg, TokenIdenticalToColocatedWithPrefillCacheHits) {
  if (!parallel::have_gloo()) GTEST_SKIP() << "this build has no gloo (the CPU KV transport)";
  const fs::path dir = fs::temp_directory_path() / ("di_kv_" + std::to_string(std::random_device{}()));
  fs::create_directories(dir);
  auto prefill = start_kv_server("prefill", dir.string(), "p0", "d0");
  auto decode = start_kv_server("decode", dir.string(), "d0", "p0");
  auto single = start_replica({.max_num_seqs = 4, .base_ms = 1, .per_token_us = 5});
  RouterOptions o;
  o.prefill = {url_of(prefill->port())};
  o.decode = {url_of(decode->port())};
  o.http.port = 0;
  o.pool.poll_interval_s = 0.02;
  Router r(o);
  r.start();
  // Both sides of the pair meet in the background; wait until the decode side reports its name.
  for (int i = 0; i < 500 && r.pool().status()[0].reported.kv_name.empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(r.pool().status()[0].reported.kv_name, "d0");

  std::string shared;
  for (int k = 0; shared.size() < 300; ++k) shared += "shared context line " + std::to_string(k) + ". ";
  const std::vector<std::string> prompts = {shared + "first question?", shared + "second question, longer than that?",
                                            "short one", std::string(700, 'q') + "!", shared + "first question?"};
  int64_t cached_on_decode = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Reply want = post(single->port(), "/v1/completions", greedy(prompts[i], 24));
    const Reply got = post(r.port(), "/v1/completions", greedy(prompts[i], 24));
    ASSERT_EQ(got.status, 200) << got.body;
    EXPECT_EQ(text_of(got), text_of(want)) << "prompt " << i;
    EXPECT_EQ(got.j()["usage"]["completion_tokens"], 24);
    cached_on_decode += got.j()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    const Reply st = post(r.port(), "/v1/completions", greedy(prompts[i], 24, true));
    ASSERT_EQ(st.status, 200) << st.body;
    EXPECT_EQ(text_of(st), text_of(want)) << "prompt " << i << " streamed";
  }
  // n = 2 is not disaggregated (the decode server computes it): same answer all the same.
  const Reply want2 = post(single->port(), "/v1/completions", greedy(prompts[0], 8, false, 2));
  const Reply got2 = post(r.port(), "/v1/completions", greedy(prompts[0], 8, false, 2));
  ASSERT_EQ(got2.status, 200) << got2.body;
  EXPECT_EQ(got2.j()["choices"], want2.j()["choices"]);

  const json pl = get(prefill->port(), "/load").j(), dl = get(decode->port(), "/load").j();
  std::printf("prefill %s\ndecode %s\n", pl["kv_transfers"].dump().c_str(), dl["kv_transfers"].dump().c_str());
  EXPECT_EQ(pl["kv_transfers"]["sent"], 2 * prompts.size());
  EXPECT_EQ(dl["kv_transfers"]["received"], 2 * prompts.size());
  EXPECT_EQ(dl["kv_transfers"]["timed_out"], 0);
  EXPECT_GT(dl["kv_transfers"]["imported_tokens"].get<int64_t>(), 0);
  EXPECT_GT(cached_on_decode, 0);
  // The prefill server's own prefix cache hit on the repeated prompts.
  EXPECT_GT(metric(prefill->port(), "deepinfer_prefix_cache_hits_total"), 0);
  r.stop();
  prefill.reset();
  decode.reset();
  fs::remove_all(dir);
}

// The engine-level hand-off without servers: a prompt computed on engine A, its bundle imported
// into engine B, the same greedy request on B hits [0, N) and gives A's tokens. Bundles of
// another model (hash seed) or block layout are refused.
std::unique_ptr<engine::Engine> toy_engine() {
  LLMConfig c;
  c.model = "builtin:toy";
  c.max_num_seqs = 2;
  c.max_model_len = 1024;
  EnvConfig env = EnvConfig::from_environment();
  engine::apply_accelerator(c, env);
  return engine::make_engine(c, env, engine::load_parts(c, env));
}

RequestOutput run_one(engine::Engine& e, const std::vector<int32_t>& prompt, int max_tokens) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  e.add_request("r", PromptInput::from_token_ids(prompt), sp, 0);
  for (int i = 0; i < 10000; ++i)
    for (RequestOutput& o : e.step())
      if (o.finished) return o;
  ADD_FAILURE() << "request did not finish";
  return {};
}

TEST(Disagg, EngineExportImportIsExact) {
  auto a = toy_engine(), b = toy_engine();
  std::vector<int32_t> prompt;
  std::mt19937 rng(5);
  for (int i = 0; i < 203; ++i) prompt.push_back(int32_t(2 + rng() % 250));  // 12 full 16-token blocks + 11
  const RequestOutput want = run_one(*a, prompt, 1);
  const engine::KvBundle bundle = a->export_prefix(prompt);
  ASSERT_EQ(bundle.num_tokens(), 192);
  const engine::KvBundle wire = engine::decode_kv_bundle(engine::encode_kv_bundle(bundle));
  EXPECT_EQ(b->import_prefix(wire), 192);
  EXPECT_EQ(b->import_prefix(wire), 192);  // again: every block already there, shared not copied
  const RequestOutput got = run_one(*b, prompt, 20);
  EXPECT_EQ(got.num_cached_tokens, 192);
  auto c = toy_engine();
  const RequestOutput ref = run_one(*c, prompt, 20);
  EXPECT_EQ(got.outputs[0].token_ids, ref.outputs[0].token_ids);
  EXPECT_EQ(got.outputs[0].token_ids[0], want.outputs[0].token_ids[0]);
  engine::KvBundle other = bundle;
  other.hash_seed ^= 1;
  EXPECT_THROW(b->import_prefix(other), InvalidArgument);
  other = bundle;
  other.block_bytes += 4;
  EXPECT_THROW(b->import_prefix(other), InvalidArgument);
  EXPECT_EQ(b->import_prefix(engine::KvBundle{}), 0);
}

TEST(Disagg, BundleCodecRefusesBadInput) {
  engine::KvBundle b;
  b.hash_seed = 42;
  b.block_tokens = 4;
  b.block_bytes = 3;
  b.tokens = {5, 6, 7, 8, 9, 10, 11, 12};
  b.blocks = {1, 2, 3, 4, 5, 6};
  b.checkpoint.num_tokens = 8;
  b.checkpoint.bytes = {9, 9};
  const std::vector<uint8_t> wire = engine::encode_kv_bundle(b);
  const engine::KvBundle back = engine::decode_kv_bundle(wire);
  EXPECT_EQ(back.tokens, b.tokens);
  EXPECT_EQ(back.blocks, b.blocks);
  EXPECT_EQ(back.checkpoint.bytes, b.checkpoint.bytes);
  EXPECT_EQ(back.hash_seed, 42u);
  for (size_t cut : {size_t(0), size_t(5), size_t(20), wire.size() - 1}) {
    std::vector<uint8_t> t(wire.begin(), wire.begin() + long(cut));
    EXPECT_THROW(engine::decode_kv_bundle(t), InvalidArgument) << "cut at " << cut;
  }
  std::vector<uint8_t> extra = wire;
  extra.push_back(0);
  EXPECT_THROW(engine::decode_kv_bundle(extra), InvalidArgument);
  engine::KvBundle odd = b;
  odd.tokens.pop_back();  // 7 tokens: not whole blocks
  EXPECT_THROW(engine::decode_kv_bundle(engine::encode_kv_bundle(odd)), InvalidArgument);
  engine::KvBundle ck = b;
  ck.checkpoint.num_tokens = 4;
  EXPECT_THROW(engine::decode_kv_bundle(engine::encode_kv_bundle(ck)), InvalidArgument);
  std::vector<uint8_t> huge = wire;
  const uint64_t big = uint64_t(1) << 60;  // the token count field claims far more than the message
  std::memcpy(huge.data() + 8 + 8 + 8 + 8, &big, sizeof big);
  EXPECT_THROW(engine::decode_kv_bundle(huge), InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::router
