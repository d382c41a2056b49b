// Helpers of the router tests: in-process `serve` replicas on the toy model slowed down to a
// fixed time per forward (so queues form and a replica can be caught mid-request, without
// burning the CI's two cores), and a small HTTP client (the router's own UpstreamCall).
#pragma once
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "core/env.h"
#include "engine/engine_factory.h"
#include "router/upstream.h"
#include "server/server.h"

namespace deepinfer::router::testing {
using nlohmann::json;

// The toy model with a sleep per forward: base + per token (a prefill of many tokens costs more).
class SlowModel final : public model::CausalLM {
 public:
  SlowModel(std::unique_ptr<model::CausalLM> inner, double base_ms, double per_token_us)
      : m_(std::move(inner)), base_ms_(base_ms), per_token_us_(per_token_us) {}
  int64_t vocab_size() const override { return m_->vocab_size(); }
  int64_t max_model_len() const override { return m_->max_model_len(); }
  int64_t eos_token_id() const override { return m_->eos_token_id(); }
  int64_t bos_token_id() const override { return m_->bos_token_id(); }
  std::string describe() const override { return "slow " + m_->describe(); }
  kv::CacheGeometry plan_cache(size_t b, int64_t s) const override { return m_->plan_cache(b, s); }
  void allocate_cache(const kv::CacheGeometry& g) override { m_->allocate_cache(g); }
  void reset_slot(int32_t s) override { m_->reset_slot(s); }
  model::ForwardOutput run(const model::ForwardBatch& b, const model::ForwardOptions& o) override {
    const double us = base_ms_ * 1000.0 + per_token_us_ * double(b.num_tokens());
    std::this_thread::sleep_for(std::chrono::microseconds(int64_t(us)));
    return m_->run(b, o);
  }
  int64_t max_rollback() const override { return m_->max_rollback(); }
  void rollback(int32_t s, int64_t n, int64_t k) override { m_->rollback(s, n, k); }
  model::SlotSnapshot save_slot(int32_t s, int64_t n) override { return m_->save_slot(s, n); }
  void restore_slot(int32_t s, const model::SlotSnapshot& sn) override { m_->restore_slot(s, sn); }
  bool can_save_slot(int32_t s, int64_t n) const override { return m_->can_save_slot(s, n); }
  size_t paged_block_bytes() const override { return m_->paged_block_bytes(); }
  void copy_blocks_to_host(std::span<const model::HostBlockCopy> c) override { m_->copy_blocks_to_host(c); }
  void copy_blocks_from_host(std::span<const model::HostBlockCopy> c) override { m_->copy_blocks_from_host(c); }
  model::Drafter* drafter() override { return m_->drafter(); }

 private:
  std::unique_ptr<model::CausalLM> m_;
  double base_ms_, per_token_us_;
};

struct ReplicaOptions {
  int64_t max_num_seqs = 4;
  double base_ms = 3, per_token_us = 20;
  int port = 0;
};

inline std::unique_ptr<server::Server> start_replica(const ReplicaOptions& ro, server::KvTransportOptions kv = {}) {
  server::ServeOptions o;
  o.kv = std::move(kv);
  o.llm.model = "builtin:toy";
  o.llm.max_num_seqs = ro.max_num_seqs;
  o.llm.max_model_len = 2048;
  o.http.port = ro.port;
  o.served_model_name = "toy";
  EnvConfig env = EnvConfig::from_environment();
  engine::apply_accelerator(o.llm, env);
  engine::LoadedParts parts = engine::load_parts(o.llm, env);
  parts.model = std::make_unique<SlowModel>(std::move(parts.model), ro.base_ms, ro.per_token_us);
  auto eng = engine::make_engine(o.llm, env, std::move(parts));
  auto s = std::make_unique<server::Server>(o, std::move(eng), "builtin:toy");
  s->start();
  return s;
}

inline std::string url_of(int port) { return "http://127.0.0.1:" + std::to_string(port); }

struct Reply {
  int status = 0;
  std::string backend;  // X-Deepinfer-Backend
  std::string body;
  json j() const { return json::parse(body, nullptr, false); }
};

inline Reply post(int port, const std::string& path, const json& body) {
  Reply r;
  try {
    UpstreamCall c(parse_url(url_of(port)), "POST", path, body.dump(), {{"Content-Type", "application/json"}}, {5, 120});
    r.status = c.read_head();
    r.backend = c.header("X-Deepinfer-Backend");
    r.body = c.read_all();
  } catch (const UpstreamError& e) {
    r.status = -1;
    r.body = e.what();
  }
  return r;
}

inline Reply get(int port, const std::string& path) {
  Reply r;
  try {
    auto [s, b] = simple_get(parse_url(url_of(port)), path, 10);
    r.status = s;
    r.body = b;
  } catch (const UpstreamError& e) {
    r.status = -1;
    r.body = e.what();
  }
  return r;
}

// A Prometheus sample (summed over label sets) of GET /metrics; -1 when absent.
inline double metric(int port, const std::string& name) {
  const std::string body = get(port, "/metrics").body;
  double sum = -1;
  for (size_t p = 0; (p = body.find("\n" + name, p)) != std::string::npos; ++p) {
    const size_t e = body.find('\n', p + 1);
    const std::string line = body.substr(p + 1, e - p - 1);
    const char next = line.size() > name.size() ? line[name.size()] : ' ';
    if (next != ' ' && next != '{') continue;
    sum = std::max(sum, 0.0) + std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

// The `data:` payloads of an SSE body, in order ("[DONE]" included).
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t p = 0;
  while ((p = body.find("data: ", p)) != std::string::npos) {
    const size_t e = body.find("\n\n", p);
    out.push_back(body.substr(p + 6, (e == std::string::npos ? body.size() : e) - p - 6));
    p = e == std::string::npos ? body.size() : e + 2;
  }
  return out;
}

}  // namespace deepinfer::router::testing
