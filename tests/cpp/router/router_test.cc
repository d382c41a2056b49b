// The router end to end over loopback, in front of in-process `serve` replicas on the slowed toy
// model (router_test_util.h): endpoints and streaming passed through, balance under skewed load,
// prefix affinity against random routing (cached prompt tokens the replicas report), a replica
// killed mid-run (unstarted requests served elsewhere, nothing lost or duplicated, a clear error
// for streams it had started), and the replica coming back.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "router/router.h"
#include "router_test_util.h"

namespace deepinfer::router {
namespace {
using namespace testing;

struct Cluster {
  std::vector<std::unique_ptr<server::Server>> replicas;
  std::vector<int> ports;
  std::unique_ptr<Router> router;
  int port = 0;

  Cluster(int n, ReplicaOptions ro, Policy policy = Policy::kAffinity) {
    for (int i = 0; i < n; ++i) {
      replicas.push_back(start_replica(ro));
      ports.push_back(replicas.back()->port());
    }
    RouterOptions o;
    for (int p : ports) o.backends.push_back(url_of(p));
    o.http.port = 0;
    o.pool.policy = policy;
    o.pool.poll_interval_s = 0.02;
    o.pool.seed = 7;
    router = std::make_unique<Router>(o);
    router->start();
    port = router->port();
  }
  int index_of(const std::string& backend) const {
    for (size_t i = 0; i < ports.size(); ++i)
      if (backend == url_of(ports[i])) return int(i);
    return -1;
  }
};

json completion(const std::string& prompt, int max_tokens, bool stream = false) {
  json j = {{"model", "toy"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
  if (stream) j["stream"] = true;
  return j;
}

TEST(Router, EndpointsAndStreamingPassedThrough) {
  Cluster c(2, {.base_ms = 1});
  EXPECT_EQ(get(c.port, "/health").status, 200);
  const Reply models = get(c.port, "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(models.j()["data"][0]["id"], "toy");
  const Reply whole = post(c.port, "/v1/completions", completion("Hello router", 20));
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_GE(c.index_of(whole.backend), 0) << whole.backend;
  const std::string text = whole.j()["choices"][0]["text"];
  EXPECT_EQ(whole.j()["usage"]["completion_tokens"], 20);
  // The same request straight to a replica: the router changes nothing in the answer.
  const Reply direct = post(c.ports[0], "/v1/completions", completion("Hello router", 20));
  EXPECT_EQ(direct.j()["choices"][0]["text"], text);
  const Reply st = post(c.port, "/v1/completions", completion("Hello router", 20, true));
  ASSERT_EQ(st.status, 200) << st.body;
  const std::vector<std::string> ev = sse_events(st.body);
  ASSERT_GE(ev.size(), 3u) << st.body;
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string joined;
  for (size_t i = 0; i + 1 < ev.size(); ++i) joined += json::parse(ev[i])["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(joined, text);
  const Reply chat = post(c.port, "/v1/chat/completions",
                          {{"model", "toy"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 5},
                           {"stream", true}, {"temperature", 0}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(sse_events(chat.body).back(), "[DONE]");
  // The replica's errors come through as they are; the router's own are OpenAI-shaped too.
  const Reply bad = post(c.port, "/v1/completions", {{"model", "toy"}, {"prompt", "x"}, {"max_tokens", -3}});
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_TRUE(bad.j()["error"].contains("message"));
  EXPECT_EQ(get(c.port, "/nope").status, 404);
  const std::string metrics = get(c.port, "/metrics").body;
  EXPECT_NE(metrics.find("deepinfer_router_backend_up{backend=\"" + url_of(c.ports[0]) + "\"} 1"), std::string::npos)
      << metrics;
}

// Replica 0 is loaded directly (behind the router's back: it learns of it only from /load),
// then a burst of long and short requests goes through the router. The replica queues are
// sampled: a queue must never grow while the other replica is idle (idle for three samples in
// a row, a margin for the router's poll period), and the burst must lean to replica 1.
TEST(Router, BalanceUnderSkewedLoad) {
  Cluster c(2, {.max_num_seqs = 2, .base_ms = 4});
  std::vector<std::thread> direct;
  for (int i = 0; i < 4; ++i)
    direct.emplace_back([&, i] {
      EXPECT_EQ(post(c.ports[0], "/v1/completions", completion(std::string(300, char('a' + i)), 120)).status, 200);
    });
  for (int i = 0; i < 500 && c.router->pool().status()[0].reported.running_tokens == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GT(c.router->pool().status()[0].reported.running_tokens, 0);

  std::atomic<bool> done{false};
  std::vector<std::array<json, 2>> samples;
  std::thread sampler([&] {
    while (!done) {
      samples.push_back({get(c.ports[0], "/load").j(), get(c.ports[1], "/load").j()});
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  });
  std::mutex mu;
  int to[2] = {0, 0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 6; ++t)
    clients.emplace_back([&, t] {
      for (int k = 0; k < 3; ++k) {
        const int i = t * 3 + k;
        const Reply r = post(c.port, "/v1/completions", completion("request " + std::to_string(i), i % 2 ? 8 : 50));
        EXPECT_EQ(r.status, 200) << r.body;
        std::lock_guard<std::mutex> lock(mu);
        if (c.index_of(r.backend) >= 0) to[c.index_of(r.backend)]++;
      }
    });
  for (auto& t : clients) t.join();
  for (auto& t : direct) t.join();
  done = true;
  sampler.join();
  auto idle = [](const json& l) { return l["num_requests_running"] == 0 && l["num_requests_waiting"] == 0; };
  int violations = 0;
  for (size_t k = 2; k < samples.size(); ++k)
    for (int x = 0; x < 2; ++x) {
      const int y = 1 - x;
      if (samples[k][x]["num_requests_waiting"] > samples[k - 1][x]["num_requests_waiting"] && idle(samples[k][y]) &&
          idle(samples[k - 1][y]) && idle(samples[k - 2][y]))
        violations++;
    }
  std::printf("skewed burst: %d requests to the loaded replica, %d to the other; %zu samples, %d violations\n", to[0],
              to[1], samples.size(), violations);
  EXPECT_EQ(violations, 0);
  EXPECT_EQ(to[0] + to[1], 18);
  EXPECT_GT(to[1], to[0]);
}

// A shared-prefix workload (6 system prompts x 6 questions, shuffled) on 3 replicas: the share
// of prompt tokens the replicas served from their prefix caches, affinity vs random routing.
double cached_share(Policy policy) {
  Cluster c(3, {.base_ms = 1, .per_token_us = 5}, policy);
  std::vector<std::pair<int, int>> order;
  for (int g = 0; g < 6; ++g)
    for (int q = 0; q < 6; ++q) order.push_back({g, q});
  std::mt19937 rng(11);
  std::shuffle(order.begin(), order.end(), rng);
  int64_t prompt = 0, cached = 0;
  for (auto [g, q] : order) {
    std::string sys;
    for (int k = 0; sys.size() < 520; ++k) sys += "system " + std::to_string(g) + " rule " + std::to_string(k) + ". ";
    const Reply r = post(c.port, "/v1/completions", completion(sys + "question " + std::to_string(q) + "?", 2));
    EXPECT_EQ(r.status, 200) << r.body;
    const json u = r.j()["usage"];
    prompt += u["prompt_tokens"].get<int64_t>();
    cached += u["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  }
  return double(cached) / double(prompt);
}

TEST(Router, PrefixAffinityHitRateVsRandom) {
  const double affinity = cached_share(Policy::kAffinity);
  const double random = cached_share(Policy::kRandom);
  std::printf("prefix cache hit rate (cached / prompt tokens): affinity %.3f, random %.3f\n", affinity, random);
  EXPECT_GT(affinity, 0.7);
  EXPECT_GT(affinity, random + 0.1);
}

// 12 concurrent requests (half streamed) on 2 replicas; replica 0 dies mid-run. Every request
// ends exactly once: non-streamed ones all succeed (retried on replica 1), a stream replica 0
// had started ends with a replica_failed error event, any other succeeds. Replica 1 ran each
// request it answered exactly once. Then replica 0 comes back on its port and rejoins.
TEST(Router, ReplicaKilledMidRunAndBack) {
  // Which requests replica 0 holds when it dies depends on timing (a loaded CI machine shifts
  // least-load's alternation): an attempt in which it had started no stream leaves the error path
  // untested, so it is repeated on a fresh cluster, up to 4 times; every attempt checks the rest.
  std::unique_ptr<Cluster> cluster;
  std::string url0;
  int failed_streams = 0;
  for (int attempt = 0; attempt < 4 && failed_streams == 0; ++attempt) {
    cluster.reset();
    cluster = std::make_unique<Cluster>(2, ReplicaOptions{.max_num_seqs = 2, .base_ms = 5});
    Cluster& c = *cluster;
    url0 = url_of(c.ports[0]);
    struct Outcome {
      bool stream = false;
      Reply r;
    };
    std::vector<Outcome> out(12);
    std::vector<std::thread> clients;
    // Streamed or not in pairs: least-load alternates the replicas, so each gets both kinds.
    auto streamed = [](int i) { return i % 4 == 1 || i % 4 == 2; };
    for (int i = 0; i < 12; ++i) {
      out[size_t(i)].stream = streamed(i);
      clients.emplace_back([&, i] {
        out[size_t(i)].r = post(c.port, "/v1/completions", completion("job " + std::to_string(i), 60, streamed(i)));
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    // Replica 0 dies while both its running requests are producing output and others wait.
    for (int i = 0; i < 500 && get(c.ports[0], "/load").j().value("num_requests_running", 0) < 2; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(80));
    c.replicas[0].reset();  // stops and destroys it: connections drop, the port refuses
    for (auto& t : clients) t.join();
    int ok = 0, on1 = 0;
    failed_streams = 0;
    for (const Outcome& o : out) {
      ASSERT_EQ(o.r.status, 200) << o.r.body;
      if (!o.stream) {
        EXPECT_EQ(o.r.j()["usage"]["completion_tokens"], 60) << o.r.body;
        EXPECT_EQ(o.r.backend, url_of(c.ports[1]));
        ok++, on1++;
        continue;
      }
      const std::vector<std::string> ev = sse_events(o.r.body);
      ASSERT_FALSE(ev.empty());
      if (ev.back() == "[DONE]") {
        ok++;
        on1 += o.r.backend == url_of(c.ports[1]);
        continue;
      }
      const json e = json::parse(ev.back());
      EXPECT_EQ(e["error"]["code"], "replica_failed") << ev.back();
      EXPECT_EQ(o.r.backend, url0);
      failed_streams++;
    }
    std::printf("killed replica: %d requests succeeded, %d started streams ended with an error\n", ok, failed_streams);
    EXPECT_EQ(ok + failed_streams, 12);
    // No duplicates: replica 1 finished exactly the requests it answered.
    EXPECT_EQ(metric(c.ports[1], "deepinfer_request_success_total"), on1);
    EXPECT_GE(metric(c.port, "deepinfer_router_retries_total"), 1);
    const Reply h = get(c.port, "/health");
    EXPECT_EQ(h.status, 200);
    EXPECT_EQ(h.j()["backends_up"], 1);
  }
  EXPECT_GE(failed_streams, 1) << "no stream was cut in 4 attempts: the error path went untested";
  Cluster& c = *cluster;

  c.replicas[0] = start_replica({.max_num_seqs = 2, .base_ms = 1, .port = c.ports[0]});
  for (int i = 0; i < 200 && c.router->pool().num_up() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(c.router->pool().num_up(), 2);
  std::set<std::string> backends;
  std::vector<std::thread> again;
  std::mutex mu;
  for (int i = 0; i < 6; ++i)
    again.emplace_back([&, i] {
      const Reply r = post(c.port, "/v1/completions", completion("again " + std::to_string(i), 30));
      EXPECT_EQ(r.status, 200);
      std::lock_guard<std::mutex> lock(mu);
      backends.insert(r.backend);
    });
  for (auto& t : again) t.join();
  EXPECT_EQ(backends.count(url0), 1u) << "the replica that came back got no requests";
}

TEST(Router, NoBackendAndBadOptions) {
  RouterOptions o;
  o.backends = {"http://127.0.0.1:1"};  // nothing listens on port 1
  o.http.port = 0;
  o.pool.poll_interval_s = 0.05;
  Router r(o);
  r.start();
  EXPECT_EQ(r.pool().num_up(), 0);
  const Reply h = get(r.port(), "/health");
  EXPECT_EQ(h.status, 503);
  const Reply p = post(r.port(), "/v1/completions", completion("x", 2));
  EXPECT_EQ(p.status, 503) << p.body;
  EXPECT_EQ(p.j()["error"]["code"], "no_backend");
  RouterOptions bad;
  bad.backends = {"ftp://x:1"};
  EXPECT_THROW(Router{bad}, InvalidArgument);
  bad.backends = {"http://host"};
  EXPECT_THROW(Router{bad}, InvalidArgument);
  bad.backends = {};
  EXPECT_THROW(Router{bad}, InvalidArgument);
  EXPECT_THROW(parse_policy("fastest"), InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::router
