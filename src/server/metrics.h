// Server metrics in the Prometheus text format (GET /metrics): counters and histograms filled
// by the engine loop and the HTTP handlers, gauges sampled from the engine after each step.
// Names follow vLLM's where one exists (vllm:time_to_first_token_seconds ->
// deepinfer_time_to_first_token_seconds), so dashboards carry over.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace deepinfer::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // `name`_bucket{le=...}, _sum, _count lines (cumulative buckets, +Inf last).
  void render(std::string& out, const std::string& name, const std::string& help) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // [bounds + 1], not cumulative
  double sum_ = 0;
  int64_t count_ = 0;
};

// Engine state as of the last step (written by the engine thread, read by /metrics).
struct EngineGauges {
  int64_t num_running = 0, num_waiting = 0;   // sequences in the scheduler
  int64_t num_queued = 0;                     // requests accepted, not yet in the engine
  int64_t running_tokens = 0;                 // tokens of the running sequences (their cache)
  int64_t waiting_tokens = 0;                 // prompt tokens of waiting sequences not yet computed
  int64_t kv_blocks_total = 0, kv_blocks_free = 0, kv_blocks_cached = 0;
  int64_t kv_slots_total = 0, kv_slots_free = 0;
  double kv_usage = 0;                        // fraction of blocks held or pending release
  int64_t num_steps = 0, num_preemptions = 0;
  int64_t num_draft_tokens = 0, num_accepted_drafts = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  void count_http(const std::string& path, int status);
  void count_rejected(const std::string& reason);
  // A request that ran in the engine: its end, token counts and timings (seconds).
  void finished(const std::vector<std::string>& finish_reasons, int64_t prompt_tokens, int64_t generation_tokens,
                int64_t cached_prompt_tokens, double ttft, double tpot, double e2e, bool had_tokens, bool had_tpot);
  void count_tool_parse_error();
  void set_gauges(const EngineGauges& g);
  EngineGauges gauges() const;
  std::string render(const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> http_;  // (path, status) -> count
  std::map<std::string, int64_t> rejected_;
  std::map<std::string, int64_t> finish_reasons_;
  int64_t requests_ = 0, prompt_tokens_ = 0, generation_tokens_ = 0, cached_prompt_tokens_ = 0;
  int64_t tool_parse_errors_ = 0;
  Histogram ttft_, tpot_, e2e_, prompt_len_, gen_len_;
  EngineGauges gauges_;
};

}  // namespace deepinfer::server
