// Adaptive drafting (DEEPINFER_SPEC_ADAPTIVE, issue #11/#12): a request stops drafting while its
// measured acceptance cannot pay for what drafting costs, and re-probes later.
//
// Cost model, measured live: the engine's steps are timed (the period between two applied steps,
// drafting steps being synchronous) and kept apart by kind and batch size (power-of-two buckets of
// running sequences): a drafting step (most sequences verify drafts and ask for more: target
// forward over 1 + L tokens each, the drafter's L rounds) and a plain step (no drafts verified or
// asked: the target's 1-token forward plus the drafter's feed round, which a request that stopped
// drafting still pays so that it can resume). Drafting pays for a request when the tokens it commits
// per verify step (1 + accepted drafts, an exponential average) reach t_drafting / t_plain; below
// that it stops for `off_steps` steps (doubling up to max_off_steps each time a re-probe fails, reset
// when one succeeds), then drafts again for min_verifies verify steps before it is judged anew.
// In a batch the scheduler judges each request by the batch's mean instead of its own: a drafting
// step costs about the same whichever requests draft in it (the drafter's rounds are one launch
// and one host sync each for the whole batch), so stopping some requests only loses their
// acceptance; the step gets cheaper only when all of them stop (measured on the H200: per-request
// stops at batch 8 cost 20% against drafting always, PERFORMANCE.md). Alone, the request's own
// average is the batch's.
// While the plain time of the current bucket is unknown (or older than probe_every steps) and some
// request could be judged, the scheduler asks for a probe: two plain steps.
// A plain step is one the drafter does not follow (SchedulerOutput::feeds_drafter false): every
// scheduled sequence is stopped (or a probe runs), so the target runs its plain decode graph
// without hidden rows, no drafter round runs, and the engine overlaps the step with the next as
// it does without drafting. Stopped requests in a step beside drafting ones still feed the
// drafter (that costs little in a drafting step). A request's drafter state (V4 MTP: its window
// ring) misses the positions of plain steps; it feeds the drafter again for the last warm_steps
// steps of a stop, so that the re-probe drafts from a refilled window (the ring's older entries
// stay stale; drafts are verified exactly, so this costs acceptance, never correctness). The
// threshold is t_drafting / t_plain with t_plain the plain step's time: what stopping every
// request buys.

//
// The decisions follow timings, so which steps verify drafts varies between runs: greedy requests
// (and greedily drafting ones) are unaffected (their output is plain decoding's), but a seeded
// request with sampled drafts may take a different (equally distributed) path. Batch-invariant mode,
// the determinism contract, therefore turns adaptive drafting off (docs/DETERMINISM.md).
#pragma once
#include <array>
#include <cstdint>
#include <optional>

namespace deepinfer::engine {

struct DraftGateConfig {
  int32_t min_verifies = 4;      // verify steps observed before a request is judged
  // Re-probe schedule (H200, B = 64, acceptance hopeless: PERFORMANCE.md): a re-probe costs its
  // warm_steps feeding steps and min_verifies verify steps (each up to 6x a plain step), so with
  // stops of 64 doubling to 1024 and 32 warm steps, 15% of 1,000 steps (35% of a 256-token run)
  // fed or drafted and the average step cost 19% above plain decoding; 256 doubling to 4096 with
  // 8 warm steps makes that ~3% of 1,000 steps.
  int64_t off_steps = 256;       // steps a request stops drafting for, first time
  int64_t max_off_steps = 4096;  // cap of the doubling
  int64_t probe_every = 1024;    // steps after which a bucket's plain time is measured again
  double alpha = 0.25;           // weight of a new observation in the averages
  double hysteresis = 0.97;      // stop only below threshold * hysteresis
  int64_t warm_steps = 8;        // steps before a re-probe in which a stopped request feeds the drafter
  // > 0: the tokens per verify step drafting needs, instead of the measured time ratio (tests and
  // benchmarks that must stop or keep drafting whatever the timings); no probes then.
  double forced_threshold = 0;
  // False: stopped requests always feed the drafter and no step is plain; the plain time is then
  // that of a step in which nobody drafts (the behaviour before plain steps; bench-async --plain-steps 0).
  bool plain_steps = true;
};

class DraftGate {
 public:
  enum class StepKind { kOther, kDrafting, kPlain };
  // A request's state (kept in Request).
  struct Seq {
    double tokens_per_verify = 0;  // average committed tokens per verify step
    int32_t verifies = 0;          // verify steps averaged since drafting (re)started
    int64_t off_until = -1;        // no drafting before this step id
    int64_t off_period = 0;        // length of the last stop (0: never stopped)
    bool ever_off = false;
  };
  struct Stats {
    int64_t requests_stopped = 0;       // requests that stopped drafting at least once
    double stopped_tokens_per_verify = 0;  // sum over them of their average when first stopped
    int64_t stops = 0, reprobes = 0, probes = 0;
    double last_threshold = 0;          // t_drafting / t_plain when last judged
  };

  explicit DraftGate(DraftGateConfig config = {}) : config_(config) {}

  // The step that just finished had `kind` and `seqs` scheduled sequences and took `seconds`.
  void observe_step(StepKind kind, int64_t seqs, double seconds, int64_t step);
  // A verify step of `s` committed `tokens` (1 + accepted drafts).
  void observe_verify(Seq& s, int32_t tokens) const;
  // Tokens per verify step drafting needs at `seqs` sequences, when both times are measured.
  std::optional<double> threshold(int64_t seqs) const;
  // Whether a probe should run now (see above); `judgeable`: some request has min_verifies.
  bool wants_probe(int64_t step, int64_t seqs, bool judgeable) const;
  void probe_started(int64_t step);
  bool judgeable(const Seq& s) const { return s.off_until < 0 && s.verifies >= config_.min_verifies; }
  // Whether the request drafts at `step` (with `seqs` running); judges it (may stop it) or ends its
  // stop (a re-probe). `batch_tokens`: the mean tokens per verify step of the batch's judgeable
  // requests, which decides instead of the request's own (see above); unset: its own.
  bool drafts(Seq& s, int64_t step, int64_t seqs, std::optional<double> batch_tokens = std::nullopt);
  // Whether the request's drafter state follows step `step` (after drafts() decided it): always
  // while it drafts, in the last warm_steps steps of a stop (refilling the drafter's window).
  bool feeds(const Seq& s, int64_t step) const {
    return !config_.plain_steps || s.off_until < 0 || step + config_.warm_steps >= s.off_until;
  }
  const Stats& stats() const { return stats_; }
  const DraftGateConfig& config() const { return config_; }

 private:
  static constexpr int kBuckets = 12;
  struct Time {
    double seconds = 0;
    int32_t samples = 0;
    int64_t step = -1;  // of the last sample
  };
  static int bucket(int64_t seqs);
  static void add(Time& t, double seconds, double alpha, int64_t step);

  DraftGateConfig config_;
  std::array<Time, kBuckets> drafting_{}, plain_{};
  int64_t last_probe_ = -1;
  Stats stats_;
};

}  // namespace deepinfer::engine
