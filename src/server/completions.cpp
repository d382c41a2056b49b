// POST /v1/completions (OpenAI legacy completions, with vLLM's extra sampling fields).
//   prompt: "text" | ["text", ...] | [token ids] | [[token ids], ...]   (each prompt gets n choices)
//   echo, logprobs (top-N per token), best_of (the best n of best_of candidates, not streamed),
//   suffix (refused), return_token_ids, stream + stream_options. Parsing: server/request.cpp.
#include <algorithm>
#include <numeric>

#include "engine/engine.h"
#include "server/job.h"
#include "server/request.h"

namespace deepinfer::server {
namespace {

// OpenAI's completions logprobs: tokens, token_logprobs, top_logprobs ({token: logprob}), text_offset.
struct CompletionLogprobs {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  void add(const CompletionOutput& c, int top_n, int64_t& offset) {
    if (!c.logprobs) return;
    for (size_t i = 0; i < c.logprobs->size() && i < c.token_ids.size(); ++i) {
      const PositionLogprobs& pos = (*c.logprobs)[i];
      std::string tok;
      double lp = 0;
      json tops = json::object();
      for (const auto& [id, l] : pos) {
        if (id == c.token_ids[i]) tok = l.decoded_token, lp = l.logprob;
        if (l.rank <= top_n) tops[l.decoded_token] = l.logprob;
      }
      tokens.push_back(tok);
      token_logprobs.push_back(lp);
      top.push_back(top_n > 0 ? tops : json(nullptr));
      offsets.push_back(offset);
      offset += int64_t(tok.size());
    }
  }
  json to_json() const {
    return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
  }
};

json stop_reason(const CompletionOutput& c) {
  if (c.stop_string) return *c.stop_string;
  if (c.stop_token_id) return *c.stop_token_id;
  return nullptr;
}

class CompletionJob final : public Job {
 public:
  // n: choices returned per prompt; r.params.n (best_of) candidates generated per prompt.
  CompletionJob(ServerState& st, std::shared_ptr<Responder> r, std::string id, const CompletionRequest& req)
      : Job(st, std::move(r), "/v1/completions", std::move(id), req.common, req.params.n),
        echo_(req.echo),
        logprobs_(req.logprobs),
        n_return_(req.n),
        return_token_ids_(req.return_token_ids),
        prompt_ids_(req.return_token_ids ? req.prompts : std::vector<std::vector<int32_t>>{}) {
    choices_.resize(echo_.size() * size_t(n()));
  }

 private:
  struct Choice {
    std::string text, finish;
    json stop = nullptr;
    CompletionLogprobs lp;
    int64_t offset = 0;
    bool echoed = false;
    double cumulative_logprob = 0;  // ranks best_of candidates
    std::vector<int32_t> token_ids;   // for return_token_ids
  };
  std::string take_echo(int i) {
    Choice& c = choices_[size_t(i)];
    if (c.echoed) return "";
    c.echoed = true;
    return echo_[size_t(i / n())];
  }
  void on_piece(int i, const CompletionOutput& c) override {
    Choice& ch = choices_[size_t(i)];
    const std::string text = take_echo(i) + c.text;
    if (c.cumulative_logprob) ch.cumulative_logprob = *c.cumulative_logprob;
    if (return_token_ids_) ch.token_ids.insert(ch.token_ids.end(), c.token_ids.begin(), c.token_ids.end());
    if (!stream()) {
      ch.text += text;
      if (logprobs_) ch.lp.add(c, *logprobs_, ch.offset);
      return;
    }
    // A piece without text (a skipped special token, an incomplete character) is still sent when
    // it carries logprobs, so that every token is listed.
    if (text.empty() && !c.finished() && !(logprobs_ && !c.token_ids.empty())) return;
    json choice = {{"index", i}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (logprobs_) {
      CompletionLogprobs piece;
      piece.add(c, *logprobs_, ch.offset);
      choice["logprobs"] = piece.to_json();
    }
    if (c.finished()) {
      choice["finish_reason"] = c.finish_reason;
      choice["stop_reason"] = stop_reason(c);
    }
    json chunk = chunk_base("text_completion");
    chunk["choices"] = json::array({choice});
    emit(chunk);
  }
  void on_choice_end(int i, const CompletionOutput& c) override {
    choices_[size_t(i)].finish = c.finish_reason;
    choices_[size_t(i)].stop = stop_reason(c);
  }
  // Per prompt, the candidates to return: all of them, or the n_return_ best by cumulative
  // logprob (ties: the lower index first) when best_of > n.
  std::vector<size_t> returned(size_t prompt) const {
    std::vector<size_t> idx(static_cast<size_t>(n()));
    std::iota(idx.begin(), idx.end(), prompt * size_t(n()));
    if (n_return_ < n()) {
      std::stable_sort(idx.begin(), idx.end(),
                       [&](size_t a, size_t b) { return choices_[a].cumulative_logprob > choices_[b].cumulative_logprob; });
      idx.resize(size_t(n_return_));
    }
    return idx;
  }
  json response_body() override {
    json body = chunk_base("text_completion");
    json cs = json::array();
    for (size_t p = 0; p < echo_.size(); ++p) {
      for (size_t i : returned(p)) {
        const Choice& c = choices_[i];
        json choice = {{"index", cs.size()},
                       {"text", c.text},
                       {"logprobs", logprobs_ ? c.lp.to_json() : json(nullptr)},
                       {"finish_reason", c.finish.empty() ? json(nullptr) : json(c.finish)},
                       {"stop_reason", c.stop}};
        if (return_token_ids_) choice["prompt_token_ids"] = prompt_ids_[p], choice["token_ids"] = c.token_ids;
        cs.push_back(std::move(choice));
      }
    }
    body["choices"] = cs;
    return body;
  }
  // usage counts the returned choices' tokens (as vLLM does for best_of).
  int64_t usage_completion_tokens() const override {
    int64_t total = 0;
    for (size_t p = 0; p < echo_.size(); ++p)
      for (size_t i : returned(p)) total += completion_tokens_[i];
    return total;
  }

  std::vector<std::string> echo_;
  std::optional<int> logprobs_;
  int n_return_;
  bool return_token_ids_;
  std::vector<std::vector<int32_t>> prompt_ids_;
  std::vector<Choice> choices_;
};

}  // namespace

void handle_completions(ServerState& st, const HttpRequest& req, std::shared_ptr<Responder> resp) {
  const double received = engine::now_seconds();
  CompletionRequest r = parse_completion_request(st.request, req.body);
  try {
    if (r.params.structured_outputs && st.loop->engine().grammar())
      st.loop->engine().grammar()->compile(*r.params.structured_outputs);  // cached for add_request
  } catch (const Error& e) {
    bad_request(e.what());
  }
  auto job = std::make_shared<CompletionJob>(st, resp, st.new_id("cmpl"), r);
  job->set_kv(req);
  job->submit(std::move(r.prompts), r.params, received);
}

}  // namespace deepinfer::server
