#include "engine/output_processor.h"

#include <algorithm>

#include "core/check.h"
#include "engine/request.h"

namespace deepinfer::engine {
namespace {
// Bytes at the end of `text` that could still grow into one of `stops`.
size_t partial_stop_suffix(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops)
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) { hold = k; break; }
  return hold;
}
}  // namespace

void OutputProcessor::add(const std::string& request_id, std::string prompt_text,
                          std::shared_ptr<const std::vector<int32_t>> prompt_ids,
                          std::shared_ptr<const SamplingParams> params, const std::vector<int64_t>& seq_ids,
                          double arrival_time) {
  Parent p;
  p.request_id = request_id;
  p.prompt_text = std::move(prompt_text);
  p.prompt_ids = std::move(prompt_ids);
  p.params = std::move(params);
  p.seq_ids = seq_ids;
  p.children.resize(seq_ids.size());
  if (p.params->prompt_logprobs) p.prompt_logprobs.emplace(p.prompt_ids->size());
  p.metrics.arrival_time = arrival_time;
  for (size_t i = 0; i < seq_ids.size(); ++i) seq_owner_[seq_ids[i]] = {request_id, int(i)};
  parents_.emplace(request_id, std::move(p));
}

PositionLogprobs OutputProcessor::format_logprobs(const TokenLogprobs& lp) const {
  // A top-N id the codec cannot decode gets no text instead of failing the request (only the
  // sampled tokens' text can end a request, and scan_stops sees those).
  auto text = [&](int32_t t) {
    if (!codec_) return std::string();
    try {
      return sanitize_utf8(codec_->token_bytes(t));
    } catch (const Error&) {
      return std::string();
    }
  };
  PositionLogprobs out;
  out.emplace_back(lp.token, Logprob{lp.logprob, lp.rank, text(lp.token)});
  for (size_t i = 0; i < lp.top.size(); ++i) {
    if (lp.top[i].first == lp.token) continue;
    out.emplace_back(lp.top[i].first, Logprob{lp.top[i].second, int32_t(i + 1), text(lp.top[i].first)});
  }
  return out;
}

const std::string* OutputProcessor::append_text(const SamplingParams& sp, std::string& text, std::string& pending,
                                                int32_t token) const {
  if (!codec_ || !sp.detokenize) return nullptr;
  if (sp.skip_special_tokens && codec_->is_special(token)) return nullptr;
  pending += codec_->token_bytes(token);
  size_t k = complete_utf8_prefix(pending);
  if (k == 0) return nullptr;
  size_t old_len = text.size();
  text += sanitize_utf8(std::string_view(pending).substr(0, k));  // invalid bytes -> U+FFFD
  pending.erase(0, k);
  if (sp.stop.empty()) return nullptr;
  // A stop string can start up to (its length - 1) bytes before the new text.
  size_t best = std::string::npos;
  const std::string* hit = nullptr;
  for (const std::string& s : sp.stop) {
    size_t from = old_len >= s.size() - 1 ? old_len - (s.size() - 1) : 0;
    size_t pos = text.find(s, from);
    if (pos != std::string::npos && pos < best) { best = pos; hit = &s; }
  }
  if (!hit) return nullptr;
  text.resize(best + (sp.include_stop_str_in_output ? hit->size() : 0));
  pending.clear();
  return hit;
}

std::vector<StopEvent> OutputProcessor::scan_stops(const ModelRunnerOutput& result) const {
  std::vector<StopEvent> events;
  for (const SampledSeq& s : result.sampled) {
    auto own = seq_owner_.find(s.seq_id);
    if (own == seq_owner_.end()) continue;
    const Parent& p = parents_.at(own->second.first);
    const Child& c = p.children[size_t(own->second.second)];
    if (c.finished() || !codec_ || !p.params->detokenize) continue;
    // A stop string completing in this step starts at most (longest - 1) bytes before it.
    size_t tail = 0;
    for (const std::string& st : p.params->stop) tail = std::max(tail, st.size());
    std::string text = c.text.substr(c.text.size() - std::min(tail, c.text.size()));
    std::string pending = c.pending;
    size_t j = 0;
    try {
      for (; j < s.tokens.size(); ++j)
        if (append_text(*p.params, text, pending, s.tokens[j])) {
          events.push_back({s.seq_id, int32_t(j), false});
          break;
        }
    } catch (const Error&) {
      events.push_back({s.seq_id, int32_t(j), true});  // token j's text failed
    }
  }
  return events;
}

void OutputProcessor::finish_child(Parent& p, Child& c, const std::string& reason) {
  if (c.finished()) return;
  if (!c.pending.empty()) c.text += sanitize_utf8(c.pending);  // incomplete tail: U+FFFD
  c.pending.clear();
  c.finish_reason = reason;
  p.num_finished++;
}

RequestOutput OutputProcessor::make_output(Parent& p) {
  const SamplingParams& sp = *p.params;
  RequestOutput r;
  r.request_id = p.request_id;
  r.prompt = p.prompt_text;
  r.prompt_token_ids = *p.prompt_ids;
  r.prompt_logprobs = p.prompt_logprobs;
  r.finished = p.num_finished == int(p.children.size());
  r.metrics = p.metrics;
  r.num_cached_tokens = p.num_cached_tokens;
  r.error = p.error;
  bool delta = sp.output_kind == OutputKind::kDelta;
  for (size_t i = 0; i < p.children.size(); ++i) {
    Child& c = p.children[i];
    size_t visible = c.text.size() - (c.finished() ? 0 : partial_stop_suffix(c.text, sp.stop));
    CompletionOutput o;
    o.index = int(i);
    size_t tok_from = delta ? c.sent_tokens : 0, text_from = delta ? std::min(c.sent_text, visible) : 0;
    o.text = c.text.substr(text_from, visible - text_from);
    o.token_ids.assign(c.token_ids.begin() + long(tok_from), c.token_ids.end());
    if (sp.logprobs) {
      o.cumulative_logprob = c.cum_logprob;
      o.logprobs.emplace(c.logprobs.begin() + long(tok_from), c.logprobs.end());
    }
    o.finish_reason = c.finish_reason;
    o.stop_token_id = c.stop_token_id;
    o.stop_string = c.stop_string;
    if (delta) {
      c.sent_tokens = c.token_ids.size();
      c.sent_text = std::max(c.sent_text, visible);
    }
    r.outputs.push_back(std::move(o));
  }
  return r;
}

OutputProcessor::Result OutputProcessor::process(const std::vector<SeqUpdate>& updates, double now) {
  Result res;
  std::vector<std::string> touched;
  for (const SeqUpdate& u : updates) {
    auto own = seq_owner_.find(u.seq_id);
    if (own == seq_owner_.end()) continue;
    Parent& p = parents_.at(own->second.first);
    Child& c = p.children[size_t(own->second.second)];
    if (std::find(touched.begin(), touched.end(), p.request_id) == touched.end()) touched.push_back(p.request_id);
    if (u.first_scheduled && p.metrics.first_scheduled_time == 0) p.metrics.first_scheduled_time = now;
    if (u.first_scheduled) p.num_cached_tokens = std::max(p.num_cached_tokens, u.num_cached_tokens);
    p.metrics.num_preemptions = std::max(p.metrics.num_preemptions, u.num_preemptions);
    if (u.num_draft_tokens > 0) {
      RequestMetrics& m = p.metrics;
      m.num_verify_steps++;
      m.num_draft_tokens += u.num_draft_tokens;
      m.num_accepted_draft_tokens += u.num_accepted_drafts;
      if (m.draft_verified_per_position.size() < size_t(u.num_draft_tokens)) {
        m.draft_verified_per_position.resize(size_t(u.num_draft_tokens), 0);
        m.draft_accepted_per_position.resize(size_t(u.num_draft_tokens), 0);
      }
      for (int32_t i = 0; i < u.num_draft_tokens; ++i) {
        m.draft_verified_per_position[size_t(i)]++;
        if (i < u.num_accepted_drafts) m.draft_accepted_per_position[size_t(i)]++;
      }
    }
    for (const PromptLogprobsChunk& ch : u.prompt_logprobs)
      for (size_t j = 0; j < ch.entries.size(); ++j) {
        auto& slot = (*p.prompt_logprobs)[size_t(ch.first_position) + j];
        if (!slot) slot = format_logprobs(ch.entries[j]);  // recompute after preemption: keep the first
      }
    if (c.finished()) continue;
    const std::string* stop = nullptr;
    try {
      for (size_t j = 0; j < u.new_token_ids.size() && !stop; ++j) {
        int32_t t = u.new_token_ids[j];
        c.token_ids.push_back(t);
        p.metrics.num_generation_tokens++;
        if (p.metrics.first_token_time == 0) p.metrics.first_token_time = now;
        p.metrics.last_token_time = now;
        if (j < u.new_logprobs.size()) {
          c.logprobs.push_back(format_logprobs(u.new_logprobs[j]));
          c.cum_logprob += u.new_logprobs[j].logprob;
        }
        stop = append_text(*p.params, c.text, c.pending, t);
        // scan_stops saw this stop: update() ended the run at this token.
        DI_CHECK(!stop || (u.finished && j + 1 == u.new_token_ids.size()), "seq ", u.seq_id, ": stop string at token ",
                 j, " of ", u.new_token_ids.size(), " was not reported by scan_stops");
      }
    } catch (const Error& e) {
      if (dynamic_cast<const InternalError*>(&e)) throw;
      // Text-side failure of one request (e.g. a token its codec cannot decode): that request
      // ends with the error; the others in the step carry on. scan_stops reported it, so
      // update() finished the sequence at this token.
      DI_CHECK(u.finished, "seq ", u.seq_id, ": text failure not reported by scan_stops: ", e.what());
      if (p.error.empty()) p.error = e.what();
      finish_child(p, c, "error");
      continue;
    }
    if (stop) {
      c.stop_string = *stop;
      finish_child(p, c, "stop");
    } else if (u.finished) {
      auto reason = FinishReason(u.finish_reason);
      if (u.stop_token_id >= 0) c.stop_token_id = u.stop_token_id;
      finish_child(p, c, finish_reason_name(reason));
    }
  }
  for (const std::string& id : touched) {
    Parent& p = parents_.at(id);
    bool done = p.num_finished == int(p.children.size());
    if (done) p.metrics.finished_time = now;
    if (done || p.params->output_kind != OutputKind::kFinalOnly) res.outputs.push_back(make_output(p));
    if (done) {
      for (int64_t s : p.seq_ids) seq_owner_.erase(s);
      parents_.erase(id);
    }
  }
  return res;
}

}  // namespace deepinfer::engine
