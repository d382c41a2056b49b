// Why V4.1 DSpark drafting on the GPU changed greedy output (issues #11 / #22): the verify /
// rollback path of the V4.1 model separated from the engine, on the v41_a_release fixture (three
// sequences of the t161 prompt, 17 / 29 / 23 tokens, batched in every step):
//  (a) plain decode, one token per sequence per step, greedy: the reference trajectory and the
//      logits of every position;
//  (b) from the same prefill, verify steps of 1 + 4 tokens whose drafts are the reference's next
//      tokens (all accepted): every row against (a);
//  (c) verify steps whose drafts go wrong after 0..4 correct ones (cycled per round and sequence),
//      the rejected positions rolled back (CausalLM::rollback) and the next round started from
//      the bonus token: every accepted row against (a); ring rows of shared-KV / Reuse layers,
//      ratio-2 compressor pairs and the Engram history all cross those rollbacks;
//  (d) plain decode whose input token is a device input (ForwardBatch::device_inputs, what the
//      engine's asynchronous scheduling hands the model: token_ids holds a placeholder 0 and the
//      id is read from device memory) against (a);
//  (e) through the Engine: plain greedy with asynchronous scheduling (device inputs), plain
//      synchronous, plain with host sampling, and DSpark drafts (fixed L = 4) against each other.
// (a)-(d) run on the GPU in exact numerics (graphs and the general path) and in batch-invariant
// production numerics, and on the CPU model (no device inputs there) to show what is expected.
// Printed: per phase the max |dlogit| of each step and the first step whose argmax differs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "golden.h"
#include "model/deepseek/cuda/v41_cuda_model.h"
#include "model/deepseek_v41/model.h"
#include "model/sequence_runner.h"
#include "ops/cuda/runtime.h"
#if defined(DEEPINFER_TEST_HAVE_ENGINE)
#include "engine/engine.h"
#endif

namespace deepinfer::model::v41 {
namespace {
using deepinfer::testing::golden_dir;
using deepinfer::testing::read_inputs;
using ds::cuda::CudaModelOptions;
using ds::cuda::DecodePath;
using ds::cuda::Numerics;
constexpr int64_t kK = 5;        // tokens of a verify step per sequence: 1 + 4 drafts (the engine's L = 4)
constexpr int64_t kSteps = 26;   // reference positions decoded after each prompt
constexpr int64_t kRollback = 6;
const int64_t kPromptLens[] = {17, 29, 23};

bool have_gpu() { return cuda::cuda_device_count() > 0; }

int32_t argmax(const float* row, int64_t V) { return int32_t(std::max_element(row, row + V) - row); }

// One sequence's chunk of a step: positions [pos, pos + tokens.size()) of cache slot `slot`;
// with `device_first` the first token goes in as a device input.
struct Chunk {
  int32_t slot = 0;
  int64_t pos = 0;
  std::vector<int32_t> tokens;
  bool device_first = false;
};

// Runs the chunks as one step (logits of every row); a device-input token is staged in `ids`
// (device int32 [chunks]) at the chunk's index, and token_ids holds 0 there, as the engine's.
std::vector<std::vector<float>> run_step(DeepseekV41Model& m, const std::vector<Chunk>& cs, cuda::DeviceBuffer* ids) {
  ForwardBatch b;
  std::vector<int32_t> staged(cs.size(), 0);
  for (size_t i = 0; i < cs.size(); ++i) {
    const Chunk& c = cs[i];
    const int32_t t0 = int32_t(b.token_ids.size());
    b.seqs.push_back({.cache_slot = c.slot, .block_table = slot_block_table(m.cache_geometry(), c.slot),
                      .num_computed_tokens = c.pos, .num_new_tokens = int32_t(c.tokens.size())});
    b.token_ids.insert(b.token_ids.end(), c.tokens.begin(), c.tokens.end());
    for (int32_t j = 0; j < int32_t(c.tokens.size()); ++j) b.logits_indices.push_back(t0 + j);
    if (c.device_first) {
      staged[i] = c.tokens[0];
      b.token_ids[size_t(t0)] = 0;
      b.device_inputs.push_back({t0, int32_t(i)});
    }
  }
  if (!b.device_inputs.empty()) {
    cuda::copy_h2d(ids->data(), staged.data(), staged.size() * sizeof(int32_t), nullptr, /*sync=*/true);
    b.sampled_ids = static_cast<const int32_t*>(ids->data());
  }
  const Tensor lg = m.run(b, {}).logits;
  const int64_t V = m.vocab_size();
  std::vector<std::vector<float>> out;
  int64_t r = 0;
  for (const Chunk& c : cs) {
    out.emplace_back(lg.data<float>() + r * V, lg.data<float>() + (r + int64_t(c.tokens.size())) * V);
    r += int64_t(c.tokens.size());
  }
  return out;
}

// The reference of one sequence: traj[i] is the input at position P + i (traj[0] the prompt's
// greedy continuation), ref[i] its logits [V].
struct Ref {
  std::vector<int32_t> prompt, traj;
  std::vector<std::vector<float>> ref;
};

// Max |dlogit| and argmax agreement of compared rows, per step of a phase.
struct PhaseDiff {
  std::vector<double> step_max;
  int64_t first_argmax_step = -1;  // first step whose argmax differs from the reference
  int64_t rows = 0, argmax_differs = 0;
  double max = 0;
  void begin_step() { step_max.push_back(0); }
  void row(const float* got, const std::vector<float>& want) {
    const int64_t V = int64_t(want.size());
    double d = 0;
    for (int64_t v = 0; v < V; ++v) d = std::max(d, double(std::fabs(got[v] - want[size_t(v)])));
    step_max.back() = std::max(step_max.back(), d);
    max = std::max(max, d);
    ++rows;
    if (argmax(got, V) != argmax(want.data(), V)) {
      ++argmax_differs;
      if (first_argmax_step < 0) first_argmax_step = int64_t(step_max.size()) - 1;
    }
  }
  void print(const std::string& what) const {
    std::printf("[v41-verify] %s: %lld rows, max |dlogit| %.3g, argmax differs in %lld rows, first at step %lld\n",
                what.c_str(), (long long)rows, max, (long long)argmax_differs, (long long)first_argmax_step);
    std::printf("[v41-verify]   per step:");
    for (double d : step_max) std::printf(" %.2g", d);
    std::printf("\n");
  }
};

std::vector<Ref> prompts(const std::string& dir) {
  const std::vector<int32_t> s = read_inputs(dir).at("t161");
  std::vector<Ref> r;
  for (int64_t n : kPromptLens) r.push_back({.prompt = std::vector<int32_t>(s.begin(), s.begin() + n)});
  return r;
}

// Resets the slots and runs the prompts as one step; the prompt's last logits row per sequence.
std::vector<std::vector<float>> prefill(DeepseekV41Model& m, const std::vector<Ref>& rs) {
  std::vector<Chunk> cs;
  for (size_t i = 0; i < rs.size(); ++i) {
    m.reset_slot(int32_t(i));
    cs.push_back({.slot = int32_t(i), .pos = 0, .tokens = rs[i].prompt});
  }
  std::vector<std::vector<float>> out = run_step(m, cs, nullptr);
  const int64_t V = m.vocab_size();
  for (auto& o : out) o.erase(o.begin(), o.end() - V);
  return out;
}

// (a) plain greedy decode of every sequence, kSteps + kK positions (verify rounds read ahead).
void reference(DeepseekV41Model& m, std::vector<Ref>& rs) {
  const int64_t V = m.vocab_size();
  const auto last = prefill(m, rs);
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].traj = {argmax(last[i].data(), V)};
    rs[i].ref.clear();
  }
  for (int64_t k = 0; k < kSteps + kK; ++k) {
    std::vector<Chunk> cs;
    for (size_t i = 0; i < rs.size(); ++i)
      cs.push_back({.slot = int32_t(i), .pos = int64_t(rs[i].prompt.size()) + k, .tokens = {rs[i].traj[size_t(k)]}});
    auto out = run_step(m, cs, nullptr);
    for (size_t i = 0; i < rs.size(); ++i) {
      rs[i].traj.push_back(argmax(out[i].data(), V));
      rs[i].ref.push_back(std::move(out[i]));
    }
  }
}

// (b) / (c): verify rounds of kK tokens per sequence from the prefill on. `correct(round, seq)`
// is how many of the round's kK - 1 drafts are the reference's; the rest are wrong tokens. Rows
// up to the first wrong draft are compared, the rest rolled back.
template <typename Correct>
PhaseDiff verify_rounds(DeepseekV41Model& m, const std::vector<Ref>& rs, Correct correct) {
  const int64_t V = m.vocab_size();
  PhaseDiff d;
  prefill(m, rs);
  std::vector<int64_t> q(rs.size(), 0);  // next reference index per sequence
  for (int64_t round = 0;; ++round) {
    std::vector<Chunk> cs;
    std::vector<int64_t> good;
    for (size_t i = 0; i < rs.size(); ++i) {
      if (q[i] + kK > kSteps + kK) continue;
      const int64_t c = std::clamp<int64_t>(correct(round, int64_t(i)), 0, kK - 1);
      Chunk ch{.slot = int32_t(i), .pos = int64_t(rs[i].prompt.size()) + q[i]};
      for (int64_t j = 0; j < kK; ++j) {
        const int32_t t = rs[i].traj[size_t(q[i] + j)];
        ch.tokens.push_back(j <= c ? t : int32_t((t + 1 + j) % V));  // wrong from draft c on
      }
      cs.push_back(ch);
      good.push_back(c);
    }
    if (cs.empty()) break;
    d.begin_step();
    const auto out = run_step(m, cs, nullptr);
    for (size_t k = 0; k < cs.size(); ++k) {
      const size_t i = size_t(cs[k].slot);
      for (int64_t j = 0; j <= good[k]; ++j) d.row(out[k].data() + j * V, rs[i].ref[size_t(q[i] + j)]);
      const int64_t end = cs[k].pos + kK, keep = cs[k].pos + good[k] + 1;
      if (keep < end) m.rollback(cs[k].slot, end, keep);
      q[i] += good[k] + 1;  // the accepted drafts and the bonus token's input next round
    }
  }
  return d;
}

PhaseDiff all_accepted(DeepseekV41Model& m, const std::vector<Ref>& rs) {
  return verify_rounds(m, rs, [](int64_t, int64_t) { return kK - 1; });
}

PhaseDiff with_rejections(DeepseekV41Model& m, const std::vector<Ref>& rs) {
  // Cycled so that odd and even numbers of positions are kept (ratio-2 compressor pairs).
  return verify_rounds(m, rs, [](int64_t round, int64_t seq) { return (round * 3 + seq) % kK; });
}

// (d) plain decode with the input token read from device memory.
PhaseDiff device_inputs(DeepseekV41Model& m, const std::vector<Ref>& rs) {
  cuda::DeviceBuffer ids(rs.size() * sizeof(int32_t) + 64);
  PhaseDiff d;
  prefill(m, rs);
  for (int64_t k = 0; k < kSteps; ++k) {
    std::vector<Chunk> cs;
    for (size_t i = 0; i < rs.size(); ++i)
      cs.push_back({.slot = int32_t(i), .pos = int64_t(rs[i].prompt.size()) + k, .tokens = {rs[i].traj[size_t(k)]},
                    .device_first = true});
    d.begin_step();
    const auto out = run_step(m, cs, &ids);
    for (size_t i = 0; i < rs.size(); ++i) d.row(out[i].data(), rs[i].ref[size_t(k)]);
  }
  return d;
}

// Bounds of |dlogit| between a verify step's rows and plain decode's. Batch-invariant numerics
// must give bitwise equal rows (0), and so must a device-input step against a host-input one in
// every mode (the same shapes, only where the id is read from differs). Without batch invariance a
// verify step (5 rows per sequence) runs its GEMMs in another shape than a decode step (1 row),
// so the fp32 sums differ in the last bits, and V4.1's QAT round trips (the FP8 / FP4 rounding of
// the index query, window and compressor steps) turn a last-bit difference that crosses a rounding
// boundary into a whole quantization step: on the H200 the CPU model (b) reached 4.8e-3 (1.9e-3 in
// (c)), the GPU's exact graph path (fixed shape buckets) 1.9e-3, with no argmax differing in any
// row. 1e-2 bounds those with room and is far below the logit gaps that decide greedy tokens (the
// argmax is asserted equal in every row regardless). The GPU's exact general path, whose GEMMs see
// the same row counts either way, stayed at 3.9e-6: 1e-4 there.
constexpr double kShapeTol = 1e-2;
constexpr double kGeneralTol = 1e-4;

void expect_matches(const PhaseDiff& d, const std::string& what, double tol) {
  d.print(what);
  EXPECT_GT(d.rows, 0) << what;
  EXPECT_EQ(d.argmax_differs, 0) << what << ": first at step " << d.first_argmax_step;
  EXPECT_LE(d.max, tol) << what;
}

// The expected behaviour, on the CPU model (fp32; batch-invariant and not).
TEST(V41VerifyPath, CpuVerifyAndRollbackMatchPlainDecode) {
  const std::string dir = golden_dir("v41_a_release");
  for (const bool inv : {false, true}) {
    auto m = DeepseekV41Model::load(dir, {.max_rollback = kRollback, .batch_invariant = inv});
    m->allocate_cache_for(4, 256);
    std::vector<Ref> rs = prompts(dir);
    reference(*m, rs);
    const std::string what = std::string("cpu") + (inv ? " batch-invariant" : "");
    const double tol = inv ? 0.0 : kShapeTol;
    expect_matches(all_accepted(*m, rs), what + " (b) all drafts accepted", tol);
    expect_matches(with_rejections(*m, rs), what + " (c) rejections + rollback", tol);
  }
}

struct GpuMode {
  Numerics numerics;
  bool invariant;
  DecodePath path;
  const char* name;
};

CudaModelOptions options(const GpuMode& g) {
  CudaModelOptions o;
  o.numerics = g.numerics;
  o.batch_invariant = g.invariant;
  o.decode = g.path;
  o.progress = false;
  o.max_batch_tokens = 1024;
  o.max_seqs = 8;
  o.max_context = 512;
  o.max_rollback = kRollback;
  return o;
}

const GpuMode kModes[] = {
    {Numerics::kExact, false, DecodePath::kGraph, "exact graph"},
    {Numerics::kExact, false, DecodePath::kGeneral, "exact general"},
    {Numerics::kProduction, true, DecodePath::kGraph, "production batch-invariant graph"},
    {Numerics::kProduction, true, DecodePath::kGeneral, "production batch-invariant general"},
};

TEST(V41VerifyPath, GpuVerifyRollbackAndDeviceInputsMatchPlainDecode) {
  if (!have_gpu()) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::string dir = golden_dir("v41_a_release");
  for (const GpuMode& g : kModes) {
    auto m = load_v41_cuda(dir, options(g));
    m->allocate_cache_for(4, 256);
    std::vector<Ref> rs = prompts(dir);
    reference(*m, rs);
    // See kShapeTol: bitwise equal rows when batch-invariant, shape-dependent rounding otherwise
    // (amplified by the QAT steps on the graph path's fixed buckets); device inputs always exact.
    const double tol = g.invariant ? 0.0 : g.path == DecodePath::kGeneral ? kGeneralTol : kShapeTol;
    const std::string what = std::string("gpu ") + g.name;
    expect_matches(all_accepted(*m, rs), what + " (b) all drafts accepted", tol);
    expect_matches(with_rejections(*m, rs), what + " (c) rejections + rollback", tol);
    expect_matches(device_inputs(*m, rs), what + " (d) device inputs", 0.0);
  }
}

#if defined(DEEPINFER_TEST_HAVE_ENGINE)
std::vector<std::vector<int32_t>> engine_greedy(std::unique_ptr<DeepseekV41Model> m, int32_t drafts, bool async,
                                                bool device_sampling, const std::vector<Ref>& rs, int n) {
  engine::EngineConfig ec;
  ec.scheduler.max_num_seqs = 8;
  ec.scheduler.max_num_batched_tokens = 1024;
  ec.kv_cache_memory_bytes = size_t(256) << 20;
  ec.num_speculative_tokens = drafts;
  ec.varlen_drafts = false;
  ec.device_sampling = device_sampling;
  ec.env.async_scheduling = async;
  engine::Engine eng(ec, std::move(m), nullptr, nullptr);
  deepinfer::SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  p.ignore_eos = true;
  for (size_t i = 0; i < rs.size(); ++i)
    eng.add_request(std::to_string(i), deepinfer::PromptInput::from_token_ids(rs[i].prompt), p, 0);
  std::vector<std::vector<int32_t>> out(rs.size());
  while (eng.has_unfinished())
    for (deepinfer::RequestOutput& o : eng.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      if (o.finished && !o.outputs.empty()) out[std::stoul(o.request_id)] = o.outputs[0].token_ids;
    }
  return out;
}

// (e) The engine's ways of running greedy decoding against the model-level reference (a) (its
// first n tokens): which of them leaves the reference.
TEST(V41VerifyPath, GpuEngineWaysAgainstPlainDecode) {
  if (!have_gpu()) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::string dir = golden_dir("v41_a_release");
  const int n = 20;
  for (const GpuMode& g : {kModes[0], kModes[2]}) {
    auto load = [&] { return load_v41_cuda(dir, options(g)); };
    std::vector<Ref> rs = prompts(dir);
    {
      auto m = load();
      m->allocate_cache_for(4, 256);
      reference(*m, rs);
    }
    struct Way {
      const char* name;
      int32_t drafts;
      bool async, device_sampling;
    };
    for (const Way& w : {Way{"plain async (device inputs)", 0, true, true}, Way{"plain sync", 0, false, true},
                         Way{"plain host sampling", 0, true, false}, Way{"DSpark L=4", 4, true, true}}) {
      const auto got = engine_greedy(load(), w.drafts, w.async, w.device_sampling, rs, n);
      int64_t equal = 0, first = -1;
      for (size_t i = 0; i < rs.size(); ++i) {
        const std::vector<int32_t> want(rs[i].traj.begin(), rs[i].traj.begin() + n);
        equal += got[i] == want;
        for (int64_t k = 0; k < int64_t(std::min(got[i].size(), want.size())); ++k)
          if (got[i][size_t(k)] != want[size_t(k)]) {
            if (first < 0 || k < first) first = k;
            break;
          }
      }
      std::printf("[v41-verify] engine %s, %s: %lld/%zu requests equal to the model-level greedy reference, "
                  "first differing output token %lld\n",
                  g.name, w.name, (long long)equal, rs.size(), (long long)first);
      // Exact numerics are not batch-invariant on the GPU (printed only); production is.
      if (g.invariant) {
        EXPECT_EQ(equal, int64_t(rs.size())) << g.name << ", " << w.name;
      }
    }
  }
}
#endif

}  // namespace
}  // namespace deepinfer::model::v41
