#include "server/job.h"

#include "engine/engine.h"

namespace deepinfer::server {
namespace {
// Routes one engine request's outputs to its job.
class SubSink final : public OutputSink {
 public:
  SubSink(std::shared_ptr<Job> job, int k) : job_(std::move(job)), k_(k) {}
  void on_output(RequestOutput&& out) override { job_->output(k_, std::move(out)); }
  void on_rejected(const std::string& message, bool internal) override { job_->rejected(k_, message, internal); }
  void on_admitted() override { job_->admitted(k_); }

 private:
  std::shared_ptr<Job> job_;
  int k_;
};
}  // namespace

Job::Job(ServerState& st, std::shared_ptr<Responder> resp, std::string path, std::string id, const CommonOptions& common,
         int n)
    : st_(st), resp_(std::move(resp)), path_(std::move(path)), id_(std::move(id)), common_(common), n_(n) {}

void Job::set_kv(const HttpRequest& req) {
  if (!st_.kv) return;
  const std::string h = req.header("X-Deepinfer-Kv");
  auto field = [&](const std::string& key) {
    const size_t p = h.find(key + "=");
    if (p == std::string::npos || (p > 0 && h[p - 1] != ';')) return std::string();
    const size_t e = h.find(';', p);
    return h.substr(p + key.size() + 1, e == std::string::npos ? std::string::npos : e - p - key.size() - 1);
  };
  if (st_.kv->is_prefill()) {
    kv_send_id_ = field("send");
    kv_send_to_ = field("to");
  } else {
    kv_recv_id_ = field("recv");
  }
}

bool Job::submit(std::vector<std::vector<int32_t>> prompts, const SamplingParams& params, double received) {
  const int64_t k = int64_t(prompts.size());
  const int64_t seqs = k * params.n;
  if (!st_.loop->try_reserve(seqs)) {
    st_.metrics.count_rejected("queue_full");
    send_error(st_, *resp_, path_,
               ApiError(503, "the server is overloaded: " + std::to_string(st_.loop->num_waiting()) +
                                 " sequences are waiting (--max-waiting " + std::to_string(st_.opt.max_waiting) +
                                 "); retry later",
                        "", "queue_full"));
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t i = 0; i < k; ++i) {
      engine_ids_.push_back(id_ + "-" + std::to_string(i));
      prompt_tokens_.push_back(int64_t(prompts[size_t(i)].size()));
    }
    cached_tokens_.assign(size_t(k), 0);
    done_.assign(size_t(k), false);
    choice_done_.assign(size_t(k * n_), false);
    completion_tokens_.assign(size_t(k * n_), 0);
  }
  SamplingParams sp = params;
  sp.output_kind = OutputKind::kDelta;
  for (int64_t i = 0; i < k; ++i) {
    Submission s;
    s.request_id = engine_ids_[size_t(i)];
    s.prompt_ids = std::move(prompts[size_t(i)]);
    s.params = sp;
    s.sink = std::make_shared<SubSink>(shared_from_this(), int(i));
    s.received_time = received;
    s.reserved = params.n;
    if (k == 1 && params.n == 1) {
      s.kv_send_id = kv_send_id_;
      s.kv_send_to = kv_send_to_;
      s.kv_recv_id = kv_recv_id_;
    }
    st_.loop->submit(std::move(s));
  }
  // After the submissions: an abort can then never overtake the request it ends.
  std::weak_ptr<Job> weak = weak_from_this();
  resp_->on_disconnect([weak] {
    if (auto j = weak.lock()) {
      std::lock_guard<std::mutex> lock(j->mu_);
      j->abort_all();
    }
  });
  return true;
}

json Job::chunk_base(const char* object) const {
  return json{{"id", id_}, {"object", object}, {"created", st_.created}, {"model", st_.model_name}};
}

int64_t Job::usage_completion_tokens() const {
  int64_t completion = 0;
  for (int64_t c : completion_tokens_) completion += c;
  return completion;
}

json Job::usage() const {
  int64_t prompt = 0, cached = 0;
  for (int64_t p : prompt_tokens_) prompt += p;
  for (int64_t c : cached_tokens_) cached += c;
  return usage_json(prompt, usage_completion_tokens(), cached, reasoning_tokens());
}

void Job::emit(const json& chunk) {
  if (common_.continuous_usage) {
    json c = chunk;
    c["usage"] = usage();
    resp_->write("data: " + dump(c) + "\n\n");
    return;
  }
  resp_->write("data: " + dump(chunk) + "\n\n");
}

void Job::admitted(int) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_ || ++admitted_ < int(engine_ids_.size()) || !stream()) return;
  started_ = true;
  st_.metrics.count_http(path_, 200);
  resp_->start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Request-Id", id_}});
  on_stream_start();
}

void Job::rejected(int k, const std::string& message, bool internal) {
  std::lock_guard<std::mutex> lock(mu_);
  done_[size_t(k)] = true;
  fail(internal ? 500 : 400, message, internal);
}

void Job::fail(int status, const std::string& message, bool internal) {
  if (failed_ || ended_) return;
  failed_ = true;
  abort_all();
  if (started_) {
    resp_->write("data: " + error_body(status, message) + "\n\n");
    resp_->write("data: [DONE]\n\n");
    resp_->end();
  } else {
    send_error(st_, *resp_, path_, ApiError(status, message, "", internal ? "" : "invalid_request"));
  }
  ended_ = true;
}

void Job::abort_all() {
  for (size_t i = 0; i < engine_ids_.size(); ++i)
    if (!done_[i]) st_.loop->abort(engine_ids_[i]);
}

void Job::output(int k, RequestOutput&& o) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!o.error.empty()) {
    done_[size_t(k)] = true;
    return fail(500, o.error, true);
  }
  if (failed_) {
    done_[size_t(k)] = o.finished || done_[size_t(k)];
    return;
  }
  for (const CompletionOutput& c : o.outputs) {
    const int choice = k * n_ + c.index;
    if (choice < 0 || choice >= int(choice_done_.size()) || choice_done_[size_t(choice)]) continue;
    completion_tokens_[size_t(choice)] += int64_t(c.token_ids.size());
    on_piece(choice, c);
    if (c.finished()) {
      choice_done_[size_t(choice)] = true;
      on_choice_end(choice, c);
    }
  }
  if (!o.finished) return;
  done_[size_t(k)] = true;
  cached_tokens_[size_t(k)] = cached_prompt_tokens(o);
  if (++finished_ == int(engine_ids_.size())) finish_all();
}

void Job::finish_all() {
  if (ended_) return;
  ended_ = true;
  if (stream()) {
    if (common_.include_usage) {
      json c = chunk_base(path_ == "/v1/completions" ? "text_completion" : "chat.completion.chunk");
      c["choices"] = json::array();
      c["usage"] = usage();
      resp_->write("data: " + dump(c) + "\n\n");
    }
    resp_->write("data: [DONE]\n\n");
    resp_->end();
    return;
  }
  json body = response_body();
  body["usage"] = usage();
  send_json(st_, *resp_, path_, 200, body, {{"X-Request-Id", id_}});
}

}  // namespace deepinfer::server
