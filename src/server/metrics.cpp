#include "server/metrics.h"

#include <cmath>
#include <cstdio>

namespace deepinfer::server {
namespace {
std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}
// Prometheus label values escape backslash, quote and newline.
std::string label(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}
void head(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}
}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i]++;
  sum_ += v;
  count_++;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  head(out, name, "histogram", help);
  int64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + (i < bounds_.size() ? num(bounds_[i]) : "+Inf") + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0}),
      e2e_({0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0}),
      prompt_len_({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}),
      gen_len_({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}) {}

void ServerMetrics::count_http(const std::string& path, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  http_[{path, status}]++;
}

void ServerMetrics::count_rejected(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  rejected_[reason]++;
}

void ServerMetrics::finished(const std::vector<std::string>& reasons, int64_t prompt_tokens, int64_t gen_tokens,
                             int64_t cached, double ttft, double tpot, double e2e, bool had_tokens, bool had_tpot) {
  std::lock_guard<std::mutex> lock(mu_);
  requests_++;
  for (const std::string& r : reasons) finish_reasons_[r]++;
  prompt_tokens_ += prompt_tokens;
  generation_tokens_ += gen_tokens;
  cached_prompt_tokens_ += cached;
  if (had_tokens) ttft_.observe(ttft);
  if (had_tpot) tpot_.observe(tpot);
  e2e_.observe(e2e);
  prompt_len_.observe(double(prompt_tokens));
  gen_len_.observe(double(gen_tokens));
}

void ServerMetrics::count_tool_parse_error() {
  std::lock_guard<std::mutex> lock(mu_);
  tool_parse_errors_++;
}

void ServerMetrics::set_gauges(const EngineGauges& g) {
  std::lock_guard<std::mutex> lock(mu_);
  gauges_ = g;
}

EngineGauges ServerMetrics::gauges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gauges_;
}

std::string ServerMetrics::render(const std::string& model_name) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string o;
  const std::string m = "model_name=\"" + label(model_name) + "\"";
  auto gauge = [&](const std::string& name, double v, const std::string& help) {
    head(o, name, "gauge", help);
    o += name + "{" + m + "} " + num(v) + "\n";
  };
  auto counter = [&](const std::string& name, double v, const std::string& help) {
    head(o, name, "counter", help);
    o += name + "{" + m + "} " + num(v) + "\n";
  };
  const EngineGauges& g = gauges_;
  gauge("deepinfer_num_requests_running", double(g.num_running), "Sequences running in the engine.");
  gauge("deepinfer_num_requests_waiting", double(g.num_waiting + g.num_queued),
        "Sequences waiting for the engine (queued in the server or the scheduler).");
  gauge("deepinfer_kv_cache_usage_perc", g.kv_usage, "Fraction of KV cache blocks in use (1 = full).");
  gauge("deepinfer_kv_cache_blocks_total", double(g.kv_blocks_total), "KV cache blocks.");
  gauge("deepinfer_kv_cache_blocks_free", double(g.kv_blocks_free), "KV cache blocks free (cached ones included).");
  gauge("deepinfer_kv_cache_blocks_cached", double(g.kv_blocks_cached), "KV cache blocks carrying a content hash.");
  gauge("deepinfer_kv_cache_slots_free", double(g.kv_slots_free), "Sequence slots free (of deepinfer_kv_cache_slots_total).");
  gauge("deepinfer_kv_cache_slots_total", double(g.kv_slots_total), "Sequence slots.");
  counter("deepinfer_engine_steps_total", double(g.num_steps), "Engine steps.");
  counter("deepinfer_num_preemptions_total", double(g.num_preemptions), "Sequences preempted for cache space.");
  counter("deepinfer_spec_decode_num_draft_tokens_total", double(g.num_draft_tokens), "Draft tokens verified.");
  counter("deepinfer_spec_decode_num_accepted_tokens_total", double(g.num_accepted_drafts), "Draft tokens accepted.");
  // Mean acceptance length of a verify step = 1 + accepted / verify steps; per draft token here.
  gauge("deepinfer_spec_decode_draft_acceptance_rate",
        g.num_draft_tokens ? double(g.num_accepted_drafts) / double(g.num_draft_tokens) : 0.0,
        "Accepted / verified draft tokens.");
  counter("deepinfer_request_success_total", double(requests_), "Requests that ran in the engine and ended.");
  head(o, "deepinfer_request_finish_total", "counter", "Completions (choices) ended, by finish reason.");
  for (const auto& [r, n] : finish_reasons_)
    o += "deepinfer_request_finish_total{" + m + ",finished_reason=\"" + label(r) + "\"} " + std::to_string(n) + "\n";
  head(o, "deepinfer_request_rejected_total", "counter", "Requests refused before the engine, by reason.");
  for (const auto& [r, n] : rejected_)
    o += "deepinfer_request_rejected_total{" + m + ",reason=\"" + label(r) + "\"} " + std::to_string(n) + "\n";
  head(o, "deepinfer_http_requests_total", "counter", "HTTP requests answered, by path and status.");
  for (const auto& [k, n] : http_)
    o += "deepinfer_http_requests_total{" + m + ",path=\"" + label(k.first) + "\",status=\"" + std::to_string(k.second) +
         "\"} " + std::to_string(n) + "\n";
  counter("deepinfer_prompt_tokens_total", double(prompt_tokens_), "Prompt tokens of finished requests.");
  counter("deepinfer_generation_tokens_total", double(generation_tokens_), "Generated tokens of finished requests.");
  counter("deepinfer_prefix_cache_queries_total", double(prompt_tokens_), "Prompt tokens looked up in the prefix cache.");
  counter("deepinfer_prefix_cache_hits_total", double(cached_prompt_tokens_), "Prompt tokens found in the prefix cache.");
  gauge("deepinfer_prefix_cache_hit_rate", prompt_tokens_ ? double(cached_prompt_tokens_) / double(prompt_tokens_) : 0.0,
        "Cached / looked-up prompt tokens since start.");
  counter("deepinfer_tool_call_parse_errors_total", double(tool_parse_errors_), "Malformed DSML tool-call blocks.");
  ttft_.render(o, "deepinfer_time_to_first_token_seconds", "Time from request arrival to its first token.");
  tpot_.render(o, "deepinfer_time_per_output_token_seconds", "Mean time between output tokens after the first, per request.");
  e2e_.render(o, "deepinfer_e2e_request_latency_seconds", "Time from request arrival to its end.");
  prompt_len_.render(o, "deepinfer_request_prompt_tokens", "Prompt tokens per request.");
  gen_len_.render(o, "deepinfer_request_generation_tokens", "Generated tokens per request (all choices).");
  return o;
}

}  // namespace deepinfer::server
