#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/logging.h"

namespace deepinfer::engine {
namespace {
bool earlier(const Request* a, const Request* b) {
  return a->arrival != b->arrival ? a->arrival < b->arrival : a->sample_index < b->sample_index;
}
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kNone: break;
  }
  return "";
}

Scheduler::Scheduler(const SchedulerConfig& config, KVCacheManager& cache, int64_t vocab_size)
    : config_(config), cache_(cache), prefix_(config.prefix_cache, cache.geometry().block_tokens),
      host_(config.prefix_cache.enabled ? config.prefix_cache.host_blocks : 0),
      vocab_size_(vocab_size), gate_(config.draft_gate) {
  DI_CHECK(config.max_num_seqs > 0 && config.max_num_batched_tokens > 0 && config.num_speculative_tokens >= 0,
           "bad scheduler config");
}

void Scheduler::add(std::unique_ptr<Request> request) {
  Request* r = request.get();
  DI_CHECK(r->prompt_len() > 0 && r->max_output_tokens > 0, "unvalidated request ", r->seq_id);
  DI_CHECK(!requests_.count(r->seq_id), "duplicate seq id ", r->seq_id);
  requests_.emplace(r->seq_id, std::move(request));
  first_scheduled_pending_[r->seq_id] = true;
  insert_waiting(r);
}

const Request* Scheduler::get(int64_t seq_id) const {
  auto it = requests_.find(seq_id);
  return it == requests_.end() ? nullptr : it->second.get();
}

void Scheduler::insert_waiting(Request* r) {
  r->status = RequestStatus::kWaiting;
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), r, earlier), r);
}

void Scheduler::insert_running(Request* r) {
  r->status = RequestStatus::kRunning;
  running_.insert(std::upper_bound(running_.begin(), running_.end(), r, earlier), r);
}

void Scheduler::preempt(Request* r, SchedulerOutput& out) {
  cache_.free(r->seq_id, r->last_step_id);  // reusable once its last step completed
  r->num_computed_tokens = 0;
  r->inflight_tokens = 0;  // a step in flight still runs it; update() then skips it (it waits)
  r->inflight_samples = 0;
  r->draft_tokens.clear();
  r->draft_logprobs.clear();
  r->num_preemptions++;
  stats_.num_preemptions++;
  out.preempted_seq_ids.push_back(r->seq_id);
  running_.erase(std::find(running_.begin(), running_.end(), r));
  insert_waiting(r);
  DI_DEBUG("preempted seq ", r->seq_id, " (", r->num_tokens(), " tokens)");
}

std::vector<int32_t> Scheduler::plan_drafts(Request& r, int64_t room, int32_t cap) const {
  const int64_t n_out = int64_t(r.output_ids.size());
  // Accepting k drafts commits k + 1 tokens: never verify past max_tokens.
  int64_t n = std::min({int64_t(r.draft_tokens.size()), int64_t(config_.num_speculative_tokens), room,
                        r.max_output_tokens - n_out - 1});
  if (cap >= 0) n = std::min<int64_t>(n, cap);
  if (n <= 0) return {};
  if (r.grammar) {
    // Only drafts the grammar accepts can be committed; cut at the first it rejects and after
    // one that terminates it. The matcher is restored (masks are built in grammar_masks()).
    if (!r.grammar->supports_rollback()) return {};
    int32_t ok = 0;
    while (ok < n && !r.grammar->is_terminated() && r.grammar->accept_token(r.draft_tokens[size_t(ok)])) ++ok;
    r.grammar->rollback(ok);
    n = ok;
  }
  return {r.draft_tokens.begin(), r.draft_tokens.begin() + n};
}

std::unordered_map<int64_t, int32_t> Scheduler::varlen_caps(int64_t budget) const {
  std::unordered_map<int64_t, int32_t> caps;
  if (!config_.varlen_drafts || config_.num_speculative_tokens <= 0) return caps;
  // The step as schedule_running will build it before drafts: every running sequence's chunk.
  int64_t base = 0;
  std::vector<const Request*> decoding;
  std::vector<DraftCandidate> cands;
  for (const Request* r : running_) {
    const int64_t remaining = r->scheduled_tokens() - r->scheduled_computed();
    const int64_t n = std::min(remaining, budget - base);
    if (n <= 0) break;
    base += n;
    // Drafts only with nothing in flight (see schedule_running).
    if (n != remaining || r->draft_tokens.empty() || r->inflight_samples > 0) continue;
    DraftCandidate c;
    const size_t m = std::min(r->draft_tokens.size(), size_t(config_.num_speculative_tokens));
    for (size_t i = 0; i < m; ++i) {
      const float lp = i < r->draft_logprobs.size() ? r->draft_logprobs[i] : 0.f;
      c.accept.push_back(acceptance_.predict(int32_t(i), std::exp(lp)));
    }
    decoding.push_back(r);
    cands.push_back(std::move(c));
  }
  const std::vector<int32_t> n = choose_draft_lengths(cands, base, budget - base, config_.step_cost);
  for (size_t i = 0; i < decoding.size(); ++i) caps[decoding[i]->seq_id] = n[i];
  return caps;
}

// Returns true when a running sequence could not grow (it preempted, or waits for blocks a step in
// flight still holds): then no waiting sequence is admitted.
bool Scheduler::schedule_running(SchedulerOutput& out, int64_t& budget) {
  bool starved = false;
  const std::unordered_map<int64_t, int32_t> caps = varlen_caps(budget);
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    // Its last token is being sampled by a step in flight: update() finishes it (max_tokens).
    if (r->scheduled_outputs() >= r->max_output_tokens) { ++i; continue; }
    const int64_t done = r->scheduled_computed();
    int64_t remaining = r->scheduled_tokens() - done;
    DI_CHECK(remaining > 0, "running seq ", r->seq_id, " has nothing to compute");
    int64_t n = chunk_tokens(*r, std::min(remaining, budget), done);
    if (!config_.enable_chunked_prefill && n < remaining) { ++i; continue; }
    // Drafts come from the drafter after update(): only with nothing in flight (drafting steps are
    // applied before the next is planned).
    const auto cap = caps.find(r->seq_id);
    // Adaptive drafting: a request that stopped drafting (or a probe step) verifies nothing and asks
    // the drafter for nothing (it still feeds it, to resume later).
    const bool gated_off = n == remaining && !gate_drafts(*r, out.step_id);
    std::vector<int32_t> drafts = n == remaining && r->inflight_samples == 0 && !gated_off
                                      ? plan_drafts(*r, budget - n, cap == caps.end() ? -1 : cap->second)
                                      : std::vector<int32_t>{};
    const int32_t kept_blocks = int32_t(cache_.get(r->seq_id)->block_ids.size());
    std::vector<int32_t> new_blocks;
    bool self_preempted = false, waits = false;
    while (!cache_.allocate(r->seq_id, done + n + int64_t(drafts.size()), &new_blocks)) {
      if (!drafts.empty()) {  // verify nothing rather than preempt anyone
        drafts.clear();
        continue;
      }
      starved = true;
      // Blocks a step in flight holds come back when it completes (asynchronous scheduling): wait
      // a step for them instead of preempting more sequences whose blocks would also wait.
      if (cache_.num_pending_blocks() > 0) { waits = true; break; }
      Request* victim = running_.back();
      preempt(victim, out);
      if (victim == r) { self_preempted = true; break; }
    }
    if (self_preempted) break;  // everything after it was preempted first
    if (waits) { ++i; continue; }
    r->verifying_logprobs.assign(r->draft_logprobs.begin(),
                                 r->draft_logprobs.begin() + std::min(drafts.size(), r->draft_logprobs.size()));
    r->draft_tokens.clear();    // sent or dropped: the drafter proposes anew after this step
    r->draft_logprobs.clear();
    r->last_step_id = out.step_id;
    plan_checkpoints(*r, n, drafts, out);
    const int64_t total = n + int64_t(drafts.size());
    const bool samples = done + n == r->scheduled_tokens();
    out.cached_seqs.push_back({r->seq_id, kept_blocks, std::move(new_blocks), done});
    // Varlen: draft one more than verified now (its estimate decides next step whether it pays).
    const int32_t next = gated_off             ? 0
                         : cap == caps.end() ? -1
                                             : std::min(config_.num_speculative_tokens, int32_t(drafts.size()) + 1);
    out.scheduled.push_back({r->seq_id, int32_t(total), samples, std::move(drafts), next});
    silent_seqs_ += gated_off && !gate_feeds(*r, out.step_id);
    r->inflight_tokens += n;
    r->inflight_samples += samples ? 1 : 0;
    budget -= total;
    ++i;
  }
  return starved;
}

void Scheduler::schedule_waiting(SchedulerOutput& out, int64_t& budget) {
  while (!waiting_.empty() && budget > 0 && int64_t(running_.size()) < config_.max_num_seqs) {
    Request* r = waiting_.front();
    // Prompt logprobs need the logits of every prompt position: such requests recompute all.
    const bool lookup = prefix_.enabled() && !r->params->prompt_logprobs;
    const int64_t np = int64_t(r->prompt_ids->size());
    const int64_t max_hit = config_.replay_keep > 0 ? std::max<int64_t>(0, np - config_.replay_keep) : INT64_MAX;
    PrefixMatch hit = lookup ? prefix_.match(cache_, *r->prompt_ids, r->output_ids, /*count=*/false,
                                             host_.capacity() ? &host_ : nullptr, max_hit)
                             : PrefixMatch{};
    const int64_t start = hit.num_tokens, remaining = r->num_tokens() - start;
    r->branch_point = hit.cached_tokens > start ? hit.cached_tokens : 0;
    int64_t n = chunk_tokens(*r, std::min(remaining, budget), start);
    if (!config_.enable_chunked_prefill && n < remaining) break;
    if (!cache_.allocate_with_prefix(r->seq_id, hit.blocks, start + n)) break;  // head waits: FCFS
    if (lookup) prefix_.count_lookup(r->num_tokens(), start);
    if (r->num_cached_tokens < 0) r->num_cached_tokens = start;
    r->num_computed_tokens = start;
    if (!hit.host_slots.empty()) {  // the blocks after the device ones come back from the host tier
      const SeqCache* held = cache_.get(r->seq_id);
      for (size_t j = 0; j < hit.host_slots.size(); ++j) {
        out.block_loads.push_back({held->block_ids[hit.blocks.size() + j], hit.host_slots[j]});
        host_.take(hit.host_slots[j]);
      }
      cache_.hash_full_blocks(r->seq_id, *r->prompt_ids, r->output_ids, start);
    }
    waiting_.pop_front();
    insert_running(r);
    r->last_step_id = out.step_id;
    const SeqCache* c = cache_.get(r->seq_id);
    NewSeqData d;
    d.seq_id = r->seq_id;
    d.prompt_ids = r->prompt_ids;
    d.output_ids = r->output_ids;
    d.params = r->params;
    d.seed = r->seed;
    d.sample_index = r->sample_index;
    d.eos_token_id = r->eos_token_id;
    d.cache_slot = c->slot;
    d.block_ids = c->block_ids;
    d.num_computed_tokens = r->num_computed_tokens;
    d.restore = std::move(hit.checkpoint);
    out.new_seqs.push_back(std::move(d));
    plan_checkpoints(*r, n, {}, out);
    const bool samples = r->num_computed_tokens + n == r->num_tokens();
    out.scheduled.push_back({r->seq_id, int32_t(n), samples, {}});
    r->inflight_tokens += n;
    r->inflight_samples += samples ? 1 : 0;
    budget -= n;
  }
}

int64_t Scheduler::chunk_tokens(const Request& r, int64_t n, int64_t from) const {
  if (from < 0) from = r.num_computed_tokens;
  return config_.enable_chunked_prefill ? prefix_.cut_chunk(from, n, r.num_tokens(), r.branch_point) : n;
}

void Scheduler::plan_checkpoints(const Request& r, int64_t n, std::span<const int32_t> drafts,
                                 SchedulerOutput& out) const {
  const int64_t bt = cache_.geometry().block_tokens, from = r.scheduled_computed();
  const int64_t end = from + n + int64_t(drafts.size());
  if (!prefix_.enabled() || end / bt <= from / bt) return;  // no block boundary in (from, end]
  if (from + n > r.num_tokens()) {
    // Its input is the token a step in flight samples (asynchronous scheduling, a decode step):
    // the block's key is known once that step is applied; update() keys the saved checkpoint then.
    DI_CHECK(drafts.empty() && n == 1, "seq ", r.seq_id, ": ", n, " positions and ", drafts.size(),
             " drafts scheduled after a token in flight");
    out.checkpoints.push_back({r.seq_id, end, 0, /*deferred=*/true});
    return;
  }
  const int64_t first = (from / bt) * bt;
  uint64_t parent = cache_.hash_seed();
  if (first > 0) {
    const SeqCache* c = cache_.get(r.seq_id);
    const std::optional<uint64_t> h = cache_.content_hash(c->block_ids[size_t(first / bt - 1)]);
    // Not hashed yet while the step that fills it is in flight (update() hashes it): the same
    // hash from the tokens.
    parent = h ? *h : chain_hash(r, first / bt);
  }
  std::vector<int32_t> tokens;
  tokens.reserve(size_t(end - first));
  for (int64_t p = first; p < from + n; ++p) tokens.push_back(r.token_at(p));
  tokens.insert(tokens.end(), drafts.begin(), drafts.end());
  prefix_.plan_checkpoints(r.seq_id, first, from, parent, tokens, out.checkpoints);
}

uint64_t Scheduler::chain_hash(const Request& r, int64_t blocks) const {
  const int64_t bt = cache_.geometry().block_tokens;
  DI_CHECK(blocks >= 0 && blocks * bt <= r.num_tokens(), "seq ", r.seq_id, ": hash of ", blocks, " blocks of ",
           r.num_tokens(), " tokens");
  std::vector<int32_t> t(static_cast<size_t>(bt));
  uint64_t h = cache_.hash_seed();
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t j = 0; j < bt; ++j) t[size_t(j)] = r.token_at(b * bt + j);
    h = block_hash(h, t);
  }
  return h;
}

std::vector<SavedCheckpoint> Scheduler::keyed_checkpoints(const ModelRunnerOutput& result) const {
  std::vector<SavedCheckpoint> saved;
  saved.reserve(result.checkpoints.size());
  for (const SavedCheckpoint& c : result.checkpoints) {
    if (!c.deferred) {
      saved.push_back(c);
      continue;
    }
    // The step that sampled the block's last token was applied before this one: the request
    // holds it, unless it ended there (this step's row is dropped, and so is its checkpoint).
    auto it = requests_.find(c.seq_id);
    if (it == requests_.end() || it->second->status == RequestStatus::kFinished ||
        it->second->num_tokens() < c.num_tokens)
      continue;
    DI_CHECK(c.num_tokens % cache_.geometry().block_tokens == 0, "deferred checkpoint of seq ", c.seq_id, " at ",
             c.num_tokens, " positions, not a block boundary");
    SavedCheckpoint k = c;
    k.key = chain_hash(*it->second, c.num_tokens / cache_.geometry().block_tokens);
    k.deferred = false;
    saved.push_back(std::move(k));
  }
  return saved;
}

void Scheduler::store_checkpoints(std::span<const SavedCheckpoint> saved, int64_t unsaveable) {
  for (const SavedCheckpoint& c : saved) prefix_.put(c);
  prefix_.note_unsaveable(unsaveable);
}

void Scheduler::drain_evictions(SchedulerOutput& out) {
  for (KVCacheManager::Evicted& e : cache_.take_evicted()) {
    if (cache_.find_cached(e.hash) >= 0) continue;  // computed again meanwhile
    const int32_t slot = host_.capacity() ? host_.store(e.hash, e.parent, std::move(e.tokens)) : -1;
    if (slot >= 0) out.block_spills.push_back({e.block, slot});
    else if (!host_.has(e.hash)) prefix_.drop(e.hash);
  }
  for (uint64_t h : host_.take_evicted())
    if (cache_.find_cached(h) < 0) prefix_.drop(h);
  host_.end_step();  // slots loaded this step may take spills from the next one on
}

std::vector<SeqGrammarMasks> Scheduler::grammar_masks(const SchedulerOutput& out) {
  const size_t words = size_t((vocab_size_ + 31) / 32);
  // One job per sampling sequence (rows after drafts[0, i)), filled together: in parallel on
  // the grammar compiler's workers when it has them.
  std::vector<SeqGrammarMasks> masks;
  std::vector<GrammarMaskJob> jobs;
  for (const ScheduledSeq& s : out.scheduled) {
    auto it = requests_.find(s.seq_id);
    // Finished (or preempted) after it was scheduled: its row is dropped, no mask needed.
    if (it == requests_.end() || it->second->status != RequestStatus::kRunning) continue;
    Request& r = *it->second;
    if (!s.samples || !r.grammar) continue;
    DI_CHECK(r.inflight_samples == 1, "seq ", s.seq_id, ": grammar mask asked with ", r.inflight_samples,
             " samples in flight (the previous step must be applied first)");
    masks.push_back({s.seq_id, std::vector<std::vector<uint32_t>>(size_t(s.num_sample_rows()), std::vector<uint32_t>(words, 0))});
    jobs.push_back({r.grammar.get(), s.draft_tokens, nullptr});
  }
  for (size_t i = 0; i < jobs.size(); ++i) jobs[i].rows = &masks[i].rows;
  if (grammar_compiler_) grammar_compiler_->fill_bitmasks(jobs);
  else
    for (const GrammarMaskJob& j : jobs) j.matcher->fill_bitmasks(j.drafts, *j.rows);
  return masks;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  out.step_id = next_step_id_++;
  out.finished_seq_ids = std::move(finished_since_last_);
  finished_since_last_.clear();
  int64_t budget = config_.max_num_batched_tokens;
  batch_tokens_.reset();
  if (config_.adaptive_drafts && config_.num_speculative_tokens > 0) {
    double sum = 0;
    int64_t judged = 0;
    for (const Request* r : running_)
      if (gate_.judgeable(r->draft_gate)) sum += r->draft_gate.tokens_per_verify, ++judged;
    if (judged > 0) batch_tokens_ = sum / double(judged);
  }
  if (config_.adaptive_drafts && config_.num_speculative_tokens > 0 && probe_left_ == 0) {
    const bool judgeable = batch_tokens_.has_value();
    if (gate_.wants_probe(out.step_id, int64_t(running_.size()), judgeable)) {
      probe_left_ = 2;  // two plain steps: the proposed drafts are dropped, none asked
      gate_.probe_started(out.step_id);
    }
  }
  silent_seqs_ = 0;
  bool preempted = schedule_running(out, budget);
  if (probe_left_ > 0) probe_left_--;
  if (!preempted) schedule_waiting(out, budget);
  // A plain step when nothing scheduled drafts or feeds the drafter (new sequences feed it).
  out.feeds_drafter = config_.num_speculative_tokens > 0 &&
                      !(config_.adaptive_drafts && !out.scheduled.empty() && silent_seqs_ == int64_t(out.scheduled.size()));
  if (config_.num_speculative_tokens > 0 && !out.empty()) ++(out.feeds_drafter ? stats_.num_drafter_steps : stats_.num_plain_steps);
  drain_evictions(out);
  label_step(out);
  out.total_num_tokens = config_.max_num_batched_tokens - budget;
  stats_.num_steps++;
  stats_.max_tokens_in_step = std::max(stats_.max_tokens_in_step, out.total_num_tokens);
  stats_.max_seqs_in_step = std::max(stats_.max_seqs_in_step, int64_t(out.scheduled.size()));
  return out;
}

void Scheduler::release(Request& r) {
  cache_.free(r.seq_id, r.last_step_id);
  if (r.status == RequestStatus::kRunning) running_.erase(std::find(running_.begin(), running_.end(), &r));
  else if (r.status == RequestStatus::kWaiting) waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &r));
  r.status = RequestStatus::kFinished;
  r.draft_tokens.clear();
  r.draft_logprobs.clear();
  finished_since_last_.push_back(r.seq_id);
}

void Scheduler::record_verify(Request& r, int32_t n_drafts, int32_t accepted) {
  stats_.num_draft_tokens += n_drafts;
  stats_.num_accepted_drafts += accepted;
  if (n_drafts == 0) return;
  stats_.num_verify_steps++;
  if (config_.adaptive_drafts) gate_.observe_verify(r.draft_gate, 1 + accepted);
  const size_t L = size_t(std::max(config_.num_speculative_tokens, n_drafts));
  if (stats_.draft_verified_at.size() < L) stats_.draft_verified_at.resize(L, 0), stats_.draft_accepted_at.resize(L, 0);
  for (int32_t i = 0; i < n_drafts; ++i) {
    stats_.draft_verified_at[size_t(i)]++;
    if (i < accepted) stats_.draft_accepted_at[size_t(i)]++;
    // Calibration sees each draft up to the first rejection (later ones were never tested).
    if (i <= accepted && size_t(i) < r.verifying_logprobs.size())
      acceptance_.observe(i, std::exp(r.verifying_logprobs[size_t(i)]), i < accepted);
  }
  r.verifying_logprobs.clear();
}

bool Scheduler::gate_feeds(const Request& r, int64_t step_id) const {
  return !config_.adaptive_drafts || !config_.draft_gate.plain_steps ||
         (probe_left_ == 0 && gate_.feeds(r.draft_gate, step_id));
}

bool Scheduler::gate_drafts(Request& r, int64_t step_id) {
  if (!config_.adaptive_drafts || config_.num_speculative_tokens <= 0) return true;
  if (probe_left_ > 0) return false;  // a probe: plain steps (their drafts are dropped)
  return gate_.drafts(r.draft_gate, step_id, int64_t(running_.size()), batch_tokens_);
}

void Scheduler::label_step(const SchedulerOutput& out) {
  if (!config_.adaptive_drafts || config_.num_speculative_tokens <= 0) return;
  // Only decode steps (every sequence computes its one new token, nothing admitted) are compared.
  bool decode = out.new_seqs.empty() && !out.scheduled.empty();
  int64_t verified = 0, asked = 0;
  for (const ScheduledSeq& s : out.scheduled) {
    decode = decode && s.samples && s.num_tokens - int32_t(s.draft_tokens.size()) == 1;
    verified += !s.draft_tokens.empty();
    asked += s.num_drafts_next != 0;
  }
  const int64_t n = int64_t(out.scheduled.size());
  DraftGate::StepKind kind = DraftGate::StepKind::kOther;
  if (decode && verified * 4 >= n * 3 && asked * 4 >= n * 3) kind = DraftGate::StepKind::kDrafting;
  if (decode && verified == 0 && asked == 0 && (!out.feeds_drafter || !config_.draft_gate.plain_steps))
    kind = DraftGate::StepKind::kPlain;
  step_kinds_[out.step_id] = {kind, n};
}

void Scheduler::time_step(const SchedulerOutput& out) {
  if (!config_.adaptive_drafts || config_.num_speculative_tokens <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  auto it = step_kinds_.find(out.step_id);
  // The period since the previous step was applied: drafting steps are applied one after the
  // other, so it is this step's cost (forward, verification, drafter rounds, host work).
  if (it != step_kinds_.end() && last_update_)
    gate_.observe_step(it->second.first, it->second.second, std::chrono::duration<double>(now - *last_update_).count(),
                       out.step_id);
  if (it != step_kinds_.end()) step_kinds_.erase(it);
  for (auto i = step_kinds_.begin(); i != step_kinds_.end();)  // steps never applied
    i = i->first < out.step_id ? step_kinds_.erase(i) : std::next(i);
  last_update_ = now;
}

bool Scheduler::apply_token(Request& r, int32_t token) {
  r.output_ids.push_back(token);
  const SamplingParams& p = *r.params;
  int64_t n_out = int64_t(r.output_ids.size());
  if (r.grammar && !r.grammar->accept_token(token)) {
    DI_WARN("seq ", r.seq_id, ": sampled token ", token, " rejected by its grammar; finishing it");
    r.finish_reason = FinishReason::kAbort;
    return true;
  }
  bool may_stop = n_out > p.min_tokens;  // the sampler masks stop tokens before min_tokens
  if (may_stop && !p.ignore_eos && token == r.eos_token_id) {
    r.finish_reason = FinishReason::kStop;
    r.stop_token_id = token;
  } else if (may_stop && std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end()) {
    r.finish_reason = FinishReason::kStop;
    r.stop_token_id = token;
  } else if (n_out >= r.max_output_tokens) {
    r.finish_reason = FinishReason::kLength;
  } else if (r.grammar && r.grammar->is_terminated()) {
    r.finish_reason = FinishReason::kStop;
  }
  return r.finish_reason != FinishReason::kNone;
}

bool Scheduler::commit_tokens(Request& r, const SampledSeq& s, int32_t n, const StopEvent* stop, SeqUpdate& u) {
  for (int32_t j = 0; j < n; ++j) {
    u.new_token_ids.push_back(s.tokens[size_t(j)]);
    if (size_t(j) < s.logprobs.size()) u.new_logprobs.push_back(s.logprobs[size_t(j)]);
    if (apply_token(r, s.tokens[size_t(j)])) return true;
    if (stop && stop->token_index == j) {  // a stop string ends here, or the text failed
      r.finish_reason = stop->error ? FinishReason::kAbort : FinishReason::kStop;
      return true;
    }
  }
  return false;
}

std::vector<SeqUpdate> Scheduler::update(const SchedulerOutput& out, const ModelRunnerOutput& result,
                                         std::span<const StopEvent> stops) {
  DI_CHECK(result.step_id == out.step_id, "runner output of step ", result.step_id, " applied to step ", out.step_id);
  time_step(out);
  const std::vector<SavedCheckpoint> saved = keyed_checkpoints(result);  // before any request changes
  std::unordered_map<int64_t, const SampledSeq*> sampled;
  for (const SampledSeq& s : result.sampled) sampled[s.seq_id] = &s;
  std::unordered_map<int64_t, std::vector<const PromptLogprobsChunk*>> prompt_lp;
  for (const PromptLogprobsChunk& c : result.prompt_logprobs) prompt_lp[c.seq_id].push_back(&c);
  std::unordered_map<int64_t, const SeqDrafts*> drafts;
  for (const SeqDrafts& d : result.drafts) drafts[d.seq_id] = &d;
  std::unordered_map<int64_t, const StopEvent*> stop_at;  // the earliest event per sequence
  for (const StopEvent& e : stops)
    if (auto [it, fresh] = stop_at.try_emplace(e.seq_id, &e); !fresh && e.token_index < it->second->token_index) it->second = &e;

  std::vector<SeqUpdate> updates;
  for (const ScheduledSeq& s : out.scheduled) {
    auto it = requests_.find(s.seq_id);
    if (it == requests_.end() || it->second->status != RequestStatus::kRunning) continue;
    Request& r = *it->second;
    const int32_t n_drafts = int32_t(s.draft_tokens.size()), committed = s.num_tokens - n_drafts;
    DI_CHECK(r.inflight_tokens >= committed && r.inflight_samples >= (s.samples ? 1 : 0), "seq ", r.seq_id,
             ": step ", out.step_id, " applied with ", r.inflight_tokens, " tokens / ", r.inflight_samples,
             " samples in flight");
    r.inflight_tokens -= committed;
    r.inflight_samples -= s.samples ? 1 : 0;
    r.num_computed_tokens += committed;  // committed positions; accepted drafts below
    SeqUpdate u;
    u.seq_id = r.seq_id;
    u.num_preemptions = r.num_preemptions;
    if (auto f = first_scheduled_pending_.find(r.seq_id); f != first_scheduled_pending_.end()) {
      u.first_scheduled = true;
      u.num_cached_tokens = std::max<int64_t>(r.num_cached_tokens, 0);
      first_scheduled_pending_.erase(f);
    }
    for (auto* c : prompt_lp[r.seq_id]) u.prompt_logprobs.push_back(*c);
    if (auto sp = sampled.find(r.seq_id); sp != sampled.end()) {
      const SampledSeq& ss = *sp->second;
      DI_CHECK(s.samples && r.num_computed_tokens == r.num_tokens(), "seq ", r.seq_id, " sampled mid-prefill");
      DI_CHECK(!ss.tokens.empty() && int32_t(ss.tokens.size()) <= n_drafts + 1 &&
                   std::equal(ss.tokens.begin(), ss.tokens.end() - 1, s.draft_tokens.begin()),
               "seq ", r.seq_id, ": runner accepted ", ss.tokens.size(), " tokens that are not a draft prefix (",
               n_drafts, " drafts)");
      const int32_t accepted = int32_t(ss.tokens.size()) - 1;
      u.num_draft_tokens = n_drafts;
      u.num_accepted_drafts = accepted;
      record_verify(r, n_drafts, accepted);
      auto st = stop_at.find(r.seq_id);
      const StopEvent* stop = st == stop_at.end() ? nullptr : st->second;
      DI_CHECK(!stop || (stop->token_index >= 0 && size_t(stop->token_index) < ss.tokens.size()), "seq ", r.seq_id,
               ": stop event at token ", stop ? stop->token_index : 0, " of ", ss.tokens.size());
      if (commit_tokens(r, ss, int32_t(ss.tokens.size()), stop, u)) {
        // Blocks it filled stay findable for prefix reuse after it ends.
        cache_.hash_full_blocks(r.seq_id, *r.prompt_ids, r.output_ids,
                                std::min(r.num_computed_tokens + accepted, r.num_tokens()));
        u.finished = true;
        u.finish_reason = int(r.finish_reason);
        u.stop_token_id = r.stop_token_id;
        release(r);
      } else {
        // The accepted drafts' cache entries are kept; blocks past the new end are released.
        r.num_computed_tokens += accepted;
        cache_.truncate(r.seq_id, r.num_tokens(), out.step_id);
        if (auto d = drafts.find(r.seq_id); d != drafts.end()) {
          r.draft_tokens = d->second->tokens;
          r.draft_logprobs = d->second->logprobs;
        }
      }
    }
    // Blocks now full of computed tokens get their content hash (prefix reuse finds them by it).
    if (r.status == RequestStatus::kRunning)
      cache_.hash_full_blocks(r.seq_id, *r.prompt_ids, r.output_ids, r.num_computed_tokens);
    updates.push_back(std::move(u));
  }
  for (const SeqUpdate& u : updates)
    if (u.finished) requests_.erase(u.seq_id);
  cache_.complete_step(out.step_id);
  store_checkpoints(saved, result.num_unsaveable_checkpoints);
  return updates;
}

void Scheduler::abort(int64_t seq_id) {
  auto it = requests_.find(seq_id);
  if (it == requests_.end()) return;
  it->second->finish_reason = FinishReason::kAbort;
  release(*it->second);
  first_scheduled_pending_.erase(seq_id);
  requests_.erase(it);
}

SchedulerLoad Scheduler::load() const {
  SchedulerLoad l{.running_seqs = int64_t(running_.size()), .waiting_seqs = int64_t(waiting_.size())};
  for (const Request* r : running_) l.running_tokens += r->num_tokens();
  for (const Request* r : waiting_) l.waiting_tokens += r->num_tokens() - r->num_computed_tokens;
  return l;
}

}  // namespace deepinfer::engine
