// `deepinfer bench-flash --model DIR`: times the engine on a (V4-Flash-shaped) checkpoint, step by
// step through LLM::add_request/step, and sets each number against its floor (MODEL-DEEPSEEK-V4.md
// §10 scaled to the layers present; ANCHORS.md ceilings 4.3 TB/s copy, 790 TFLOP/s bf16):
//  * prefill: one request of --prompt-len tokens in one step (TTFT, tokens/s); floor =
//    max(FLOPs / 790 TFLOP/s, weights read once / 4.3 TB/s);
//  * decode at each --batches B: B requests of --prompt-len tokens are prefilled, then
//    --decode-steps pure decode steps (every request emits exactly one token) are timed alone
//    (TPOT = median step); floor = bytes the step must read / 4.3 TB/s, counting the dense FP8
//    linears at 1 byte + scales (the GPU model keeps them FP8 since gemm_fp8w), the other dense
//    weights in bf16, the routed experts the step touches (expected distinct experts of B tokens,
//    uniform routing) in FP4 e2m1 + e8m0/32 as they stay on the device, lm_head, and each
//    sequence's KV. (The "bf16" bytes column of older runs counted dense linears at 2 bytes.)
// Per-layer ms = step / layers (embedding, head and sampling included) next to the transformers
// eager numbers of ANCHORS.md. Used by bench/gpu_flash_bench.sh.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "cli/command.h"
#include "cli/lists.h"
#include "core/env.h"
#include "core/logging.h"
#include "deepinfer/llm.h"
#include "cli/flash_floors.h"

namespace {
using namespace deepinfer;
using Clock = std::chrono::steady_clock;

constexpr double kBandwidth = 4.3e12;  // B/s, device-to-device copy (ANCHORS.md)
constexpr double kFlops = 790e12;      // bf16 dense, cuBLAS 4096^3 (MODEL-DEEPSEEK-V4.md §10)

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::vector<int32_t> prompt_ids(int64_t n, int64_t vocab, uint64_t salt) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t x = 0x243f6a8885a308d3ull ^ (salt * 0x9e3779b97f4a7c15ull);
  for (auto& t : ids) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
    t = int32_t(2 + x % uint64_t(vocab - 2));  // skip bos/eos
  }
  return ids;
}

struct RunResult {
  double fill_s = 0;               // first step until every request has its first token
  int64_t cached_tokens = 0;       // prompt tokens the prefix cache served (shared contexts)
  std::vector<double> decode_s;    // timed pure-decode steps
  int64_t impure = 0;              // timed steps where not every request emitted exactly one token
  std::vector<OpTiming> ops;       // op_profile: per-op device time of the fill (steps = 0) or the timed steps
};

// B requests of P prompt tokens; times the fill phase, then `warm` + `steps` decode steps. With
// op_profile, the model's ops are timed (eagerly) over the fill when steps = 0, else over the timed steps.
// With a `shared` prefix (< P tokens) every prompt is that prefix + its own random suffix, so the
// prefix cache serves the prefix (up to its last checkpointed block boundary) to every request.
RunResult run(LLM& llm, int64_t B, int64_t P, int64_t warm, int64_t steps, int64_t vocab, uint64_t& salt,
              bool op_profile = false, const std::vector<int32_t>* shared = nullptr) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.ignore_eos = true;
  sp.max_tokens = int(1 + warm + steps + B + 4);  // nobody finishes inside the timed window
  sp.output_kind = OutputKind::kDelta;
  std::map<std::string, int64_t> got;
  for (int64_t i = 0; i < B; ++i) {
    std::vector<int32_t> ids;
    if (shared) {
      ids = *shared;
      const std::vector<int32_t> tail = prompt_ids(P - int64_t(shared->size()), vocab, salt++);
      ids.insert(ids.end(), tail.begin(), tail.end());
    } else {
      ids = prompt_ids(P, vocab, salt++);
    }
    got[llm.add_request(PromptInput::from_token_ids(ids), sp)] = 0;
  }
  RunResult r;
  if (op_profile && steps == 0) llm.set_op_profiling(true);
  auto t0 = Clock::now();
  int64_t have_first = 0, decoded = 0;
  while (have_first < B) {
    for (const RequestOutput& o : llm.step())
      if (!o.outputs.empty() && !o.outputs[0].token_ids.empty() && got[o.request_id]++ == 0) {
        ++have_first;
        r.cached_tokens += o.num_cached_tokens;
      }
    if (!llm.has_unfinished()) break;
  }
  r.fill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  while (decoded < warm + steps && llm.has_unfinished()) {
    auto s0 = Clock::now();
    auto outs = llm.step();
    const double dt = std::chrono::duration<double>(Clock::now() - s0).count();
    bool pure = int64_t(outs.size()) == B;
    for (const RequestOutput& o : outs) pure &= !o.outputs.empty() && o.outputs[0].token_ids.size() == 1;
    if (decoded++ < warm) {
      if (op_profile && decoded == warm) llm.set_op_profiling(true);
      continue;
    }
    r.decode_s.push_back(dt);
    r.impure += !pure;
  }
  if (op_profile) {
    r.ops = llm.take_op_profile();
    llm.set_op_profiling(false);
  }
  for (const auto& [id, n] : got) llm.abort_request(id);
  return r;
}

// One phase's per-op table: device ms per step (or per prefill) of each op, its share of the
// ops' sum, and the sum against the step's wall time (eager, with the timing events).
void print_breakdown(const char* what, const std::vector<OpTiming>& ops, double per, double step_ms, std::ofstream* js,
                     int64_t B) {
  if (ops.empty()) {
    std::printf("\n%s: no per-op times (this backend records none: op timing is the CUDA backend's)\n", what);
    return;
  }
  double sum = 0;
  for (const OpTiming& o : ops) sum += o.ms;
  std::printf("\n%s: ops sum %.3f ms per step, step wall %.3f ms (eager, op timing on): ops = %.0f%% of the step\n",
              what, sum / per, step_ms, step_ms > 0 ? 100.0 * sum / per / step_ms : 0.0);
  std::printf("  %-40s %9s %10s %7s\n", "op", "calls", "ms/step", "share");
  for (const OpTiming& o : ops) {
    std::printf("  %-40s %9.1f %10.4f %6.1f%%\n", o.op.c_str(), double(o.calls) / per, o.ms / per,
                sum > 0 ? 100.0 * o.ms / sum : 0.0);
    if (js && *js)
      *js << "{\"what\": \"op\", \"phase\": \"" << what << "\", \"batch\": " << B << ", \"op\": \"" << o.op
          << "\", \"calls_per_step\": " << double(o.calls) / per << ", \"ms_per_step\": " << o.ms / per << "}\n";
  }
}

int run_bench_flash(int argc, char** argv) {
  CLI::App app{"Time prefill and decode of the engine on a checkpoint against the bandwidth/compute floors"};
  std::string model, batches_s = "1,8,32", json_path, accelerator;
  int64_t P = 4096, steps = 64, warm = 4, reps = 2;
  double kv_gib = 4.0;
  app.add_option("-m,--model", model, "checkpoint folder (deepinfer make-flash-stack)")->required();
  app.add_option("--prompt-len", P, "prompt tokens (prefill and decode context)")->capture_default_str();
  app.add_option("--decode-steps", steps, "timed decode steps per batch size")->capture_default_str();
  app.add_option("--warmup-steps", warm, "decode steps run before timing")->capture_default_str();
  app.add_option("--batches", batches_s, "decode batch sizes, comma-separated")->capture_default_str();
  app.add_option("--prefill-reps", reps, "timed prefills (after one warm-up)")->capture_default_str();
  app.add_option("--kv-cache-gib", kv_gib, "cache budget")->capture_default_str();
  app.add_option("--accelerator", accelerator, "cpu | nvidia | auto (default: $DEEPINFER_ACCELERATOR)");
  app.add_option("--json", json_path, "also write the results as JSON lines here");
  bool floors_only = false;
  app.add_flag("--floors-only", floors_only, "print the floors from config.json and exit (no engine)");
  bool breakdown = false;
  int64_t breakdown_steps = 8;
  app.add_flag("--breakdown", breakdown,
               "also time every model op on the device (eager, events around each op): one prefill and "
               "--breakdown-steps decode steps per batch, printed per op with its share of the step");
  app.add_option("--breakdown-steps", breakdown_steps, "decode steps timed per batch for --breakdown")
      ->capture_default_str();
  std::string contexts_s;
  app.add_option("--contexts", contexts_s,
                 "prompt/context lengths, comma-separated (a grid: prefill at each, decode at each context x batch); "
                 "default: --prompt-len");
  int64_t shared_above = int64_t(1) << 18;
  app.add_option("--shared-context-above", shared_above,
                 "decode runs whose batch x context exceeds this many tokens share one context prefix through the "
                 "prefix cache (each request adds a 64-token suffix), so long contexts at large batches need one "
                 "prefill, not B; 0 = always distinct contexts")
      ->capture_default_str();
  bool calibrate_shared = false;
  app.add_flag("--calibrate-shared", calibrate_shared,
               "also run the largest distinct-context batch of each context with a shared context, to show what "
               "sharing (cache-resident KV) changes");
  std::string grid_s;
  app.add_option("--grid", grid_s,
                 "contexts with their own decode batches, e.g. \"4096:1,8,32;131072:1\" (replaces --contexts and "
                 "--batches)");
  int64_t max_batched = 0;
  app.add_option("--max-batched-tokens", max_batched,
                 "tokens per engine step (default: the longest context, at most 32768: longer prompts prefill in "
                 "chunks)");
  int64_t checkpoint_blocks = -1;
  app.add_option("--prefix-checkpoint-blocks", checkpoint_blocks,
                 "prefill chunks end at every k-th cache block so the state there is saved (-1 = automatic: "
                 "the model's weight-pass break-even; 0 = only the prompt's last block)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (checkpoint_blocks < -1) {
    std::fprintf(stderr, "bench-flash: --prefix-checkpoint-blocks must be >= -1, got %ld\n", long(checkpoint_blocks));
    return 2;
  }
  if (breakdown_steps < 1) {
    std::fprintf(stderr, "bench-flash: --breakdown-steps must be >= 1, got %ld\n", long(breakdown_steps));
    return 2;
  }
  const std::unique_ptr<cli::FlashFloors> floors = cli::make_flash_floors(model);
  const cli::FlashFloors& cm = *floors;
  const int64_t L = cm.layers(), vocab = cm.vocab();
  // contexts[i] is decoded at batches_at[i].
  std::vector<int64_t> contexts;
  std::vector<std::vector<int64_t>> batches_at;
  if (!grid_s.empty() && (app.count("--contexts") || app.count("--batches"))) {
    std::fprintf(stderr, "bench-flash: --grid replaces --contexts and --batches; give one or the other\n");
    return 2;
  }
  if (max_batched < 0) {
    std::fprintf(stderr, "bench-flash: --max-batched-tokens must be >= 0 (0 = the default), got %ld\n",
                 long(max_batched));
    return 2;
  }
  if (!grid_s.empty()) {
    for (size_t p = 0; p <= grid_s.size();) {
      const size_t e = std::min(grid_s.find(';', p), grid_s.size());
      const std::string item = grid_s.substr(p, e - p);
      p = e + 1;
      if (item.empty()) continue;
      const size_t colon = item.find(':');
      const std::vector<int64_t> c = cli::parse_int_list(item.substr(0, colon), "--grid context");
      if (c.size() != 1) {
        std::fprintf(stderr, "bench-flash: --grid entry '%s' must be CONTEXT:B,B,...\n", item.c_str());
        return 2;
      }
      contexts.push_back(c[0]);
      batches_at.push_back(colon == std::string::npos ? std::vector<int64_t>{}
                                                      : cli::parse_int_list(item.substr(colon + 1), "--grid batches"));
    }
  } else {
    contexts = contexts_s.empty() ? std::vector<int64_t>{P} : cli::parse_int_list(contexts_s, "--contexts");
    batches_at.assign(contexts.size(), cli::parse_int_list(batches_s, "--batches"));
  }
  if (contexts.empty()) {
    std::fprintf(stderr, "bench-flash: no context to run (--contexts / --grid are empty)\n");
    return 2;
  }
  int64_t maxB = 1;
  for (const auto& bs : batches_at)
    for (int64_t B : bs) {
      if (B < 1) {
        std::fprintf(stderr, "bench-flash: a decode batch must be >= 1, got %ld\n", long(B));
        return 2;
      }
      maxB = std::max(maxB, B);
    }
  for (int64_t c : contexts)
    if (c < 2 || c > cm.max_positions()) {
      std::fprintf(stderr, "bench-flash: --contexts entry %ld is outside [2, %ld]\n", long(c),
                   long(cm.max_positions()));
      return 2;
    }
  if (shared_above < 0) {
    std::fprintf(stderr, "bench-flash: --shared-context-above must be >= 0, got %ld\n", long(shared_above));
    return 2;
  }
  const int64_t maxP = *std::max_element(contexts.begin(), contexts.end());
  if (max_batched <= 0) max_batched = std::min<int64_t>(maxP, 32768);
  if (floors_only) {
    std::printf("%s: %ld layers [%s]\n", cm.family().c_str(), long(L), cm.schedule().c_str());
    for (size_t ci = 0; ci < contexts.size(); ++ci) {
      const int64_t Pc = contexts[ci];
      const std::vector<int64_t>& batches = batches_at[ci];
      const double pf = cm.prefill_flops(Pc), pb = cm.prefill_bytes(Pc);
      std::printf("prefill %ld tokens: %.2f TFLOP -> %.2f ms; %.1f GB -> %.2f ms\n", long(Pc), pf / 1e12,
                  pf / kFlops * 1e3, pb / 1e9, pb / kBandwidth * 1e3);
      for (int64_t B : batches) {
        const double ctx = double(Pc) + double(warm) + double(B) / 2 + double(steps) / 2;
        const double b = cm.decode_bytes(B, ctx, false), br = cm.decode_bytes(B, ctx, true), f = cm.decode_flops(B, ctx);
        std::printf("decode B=%ld ctx %.0f: %.2f GB -> %.3f ms (release precision %.2f GB -> %.3f ms); %.3f TFLOP -> %.3f ms; "
                    "%.1f experts/layer\n", long(B), ctx, b / 1e9, b / kBandwidth * 1e3, br / 1e9, br / kBandwidth * 1e3,
                    f / 1e12, f / kFlops * 1e3, cm.touched_experts(double(B)));
      }
    }
    return 0;
  }

  constexpr int64_t kSuffix = 64;  // each request's own tokens after a shared context prefix

  LLMConfig lc;
  lc.model = model;
  lc.skip_tokenizer_init = true;
  lc.max_num_seqs = std::max<int64_t>(maxB, 1);
  lc.max_num_batched_tokens = max_batched;  // a whole prompt per step unless it is longer
  lc.kv_cache_memory_bytes = size_t(kv_gib * double(size_t(1) << 30));
  lc.accelerator = accelerator;
  lc.prefix_checkpoint_blocks = checkpoint_blocks;
  auto t0 = Clock::now();
  LLM llm(lc);
  const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::fprintf(stderr, "bench-flash: %s\nbench-flash: loaded in %.1f s\n", llm.describe().c_str(), load_s);
  uint64_t salt = 1;

  struct Row {
    std::string what;
    int64_t B;
    double ctx, ms, floor_ms, floor_rel_ms, per_layer, hf;
    std::string basis;
    int64_t impure;
    bool shared;
    double fill_s;
    int64_t cached;
    int64_t prompt_len;
  };
  std::vector<Row> rows;
  for (size_t ci = 0; ci < contexts.size(); ++ci) {
    const int64_t Pc = contexts[ci];
    const std::vector<int64_t>& batches = batches_at[ci];
    // Decode: distinct contexts while B x context stays small, else one shared context prefix.
    std::vector<std::pair<int64_t, bool>> runs;
    int64_t largest_distinct = 0;
    bool any_shared = false, distinct_b1 = false;
    for (int64_t B : batches) {
      const bool sh = shared_above > 0 && B * Pc > shared_above && Pc > kSuffix;
      runs.push_back({B, sh});
      if (!sh) largest_distinct = std::max(largest_distinct, B);
      any_shared |= sh;
      distinct_b1 |= B == 1 && !sh;
    }
    // Calibrate where this context has shared points to compare with.
    if (calibrate_shared && any_shared && largest_distinct > 0) runs.push_back({largest_distinct, true});
    // Prefill: one warm-up (first context only), then `reps` timed (median); none with --prefill-reps 0.
    // With one rep after the first context, a distinct batch-1 decode run's fill is that prefill
    // (one request of Pc tokens until its first token), so a long context is not prefilled twice.
    const bool prefill_from_b1 = reps == 1 && ci > 0 && distinct_b1;
    std::vector<double> pf;
    for (int64_t i = ci ? 1 : 0; reps > 0 && !prefill_from_b1 && i <= reps; ++i) {
      RunResult r = run(llm, 1, Pc, 0, 0, vocab, salt);
      std::fprintf(stderr, "bench-flash: prefill %ld tokens %s: %.1f ms\n", long(Pc), i ? "" : "(warm-up)",
                   r.fill_s * 1e3);
      if (i) pf.push_back(r.fill_s);
    }
    const size_t prefill_row = rows.size();
    std::vector<int32_t> prefix;
    for (auto [B, sh] : runs) {
      if (sh && prefix.empty()) {
        // Fill the cache with the shared prefix once (its blocks stay cached after the request ends).
        prefix = prompt_ids(Pc - kSuffix, vocab, 0x5eedull + uint64_t(Pc));
        SamplingParams sp;
        sp.temperature = 0;
        sp.max_tokens = 1;
        auto f0 = Clock::now();
        llm.generate({PromptInput::from_token_ids(prefix)}, {sp});
        std::fprintf(stderr, "bench-flash: shared context prefix of %zu tokens prefilled in %.1f s\n", prefix.size(),
                     std::chrono::duration<double>(Clock::now() - f0).count());
      }
      RunResult r = run(llm, B, Pc, warm, steps, vocab, salt, false, sh ? &prefix : nullptr);
      if (prefill_from_b1 && B == 1 && !sh && pf.empty()) {
        pf.push_back(r.fill_s);
        std::fprintf(stderr, "bench-flash: prefill %ld tokens: %.1f ms (the batch-1 decode run's fill)\n", long(Pc),
                     r.fill_s * 1e3);
      }
      const double ctx = double(Pc) + double(warm) + double(B) / 2 + double(steps) / 2;
      const double bytes = cm.decode_bytes(B, ctx, true), flops = cm.decode_flops(B, ctx);
      const double fl = std::max(bytes / kBandwidth, flops / kFlops) * 1e3;
      char basis[96];
      std::snprintf(basis, sizeof basis, "%.2f GB (%.0f experts/layer), %.2f TFLOP", bytes / 1e9,
                    cm.touched_experts(double(B)), flops / 1e12);
      const double ms = median(r.decode_s) * 1e3;
      std::fprintf(stderr, "bench-flash: decode B=%ld ctx %ld%s: fill %.1f s (%ld prompt tokens cached), %zu timed steps, "
                   "median %.2f ms\n", long(B), long(Pc), sh ? " (shared context)" : "", r.fill_s, long(r.cached_tokens),
                   r.decode_s.size(), ms);
      const double hf = cm.hf_layer_ms("decode", B, Pc);
      rows.push_back({"decode", B, ctx, ms, fl, fl, ms / L, hf, basis, r.impure, sh, r.fill_s, r.cached_tokens, Pc});
    }
    if (reps > 0 && !pf.empty()) {
      const double flops = cm.prefill_flops(Pc), bytes = cm.prefill_bytes(Pc);
      const double fl = std::max(flops / kFlops, bytes / kBandwidth) * 1e3;
      char basis[96];
      std::snprintf(basis, sizeof basis, "%.1f TFLOP (%.2f ms), %.1f GB (%.2f ms)", flops / 1e12,
                    flops / kFlops * 1e3, bytes / 1e9, bytes / kBandwidth * 1e3);
      const double ms = median(pf) * 1e3;
      rows.insert(rows.begin() + std::ptrdiff_t(prefill_row),
                  Row{"prefill", 1, double(Pc), ms, fl, 0, ms / L, cm.hf_layer_ms("prefill", 1, Pc), basis, 0, false, 0, 0, Pc});
    }
  }

  if (!json_path.empty()) {
    std::ofstream js(json_path);
    for (const Row& r : rows) {
      const double tps = r.ms > 0 ? (r.what == "prefill" ? r.ctx : double(r.B)) / r.ms * 1e3 : 0;
      js << "{\"what\": \"" << r.what << "\", \"batch\": " << r.B << ", \"ctx\": " << r.ctx
         << ", \"prompt_len\": " << r.prompt_len << ", \"ms\": " << r.ms
         << ", \"tokens_per_s\": " << tps << ", \"floor_ms\": " << r.floor_ms
         << ", \"floor_release_ms\": " << r.floor_rel_ms << ", \"per_layer_ms\": " << r.per_layer
         << ", \"hf_eager_per_layer_ms\": " << r.hf << ", \"layers\": " << L << ", \"basis\": \"" << r.basis
         << "\", \"impure_steps\": " << r.impure << ", \"shared_context\": " << (r.shared ? "true" : "false")
         << ", \"fill_s\": " << r.fill_s << ", \"cached_prompt_tokens\": " << r.cached << ", \"load_s\": " << load_s
         << "}\n";
    }
  }
  const bool graphs = EnvConfig::from_environment().cuda_graphs;  // what the LLM above read
  std::printf("\n%s\nloaded in %.1f s; DEEPINFER_CUDA_GRAPHS=%d; floors: 4.3 TB/s, 790 TFLOP/s; weights as read (dense FP8 as stored, routed experts FP4)\n\n",
              llm.describe().c_str(), load_s, graphs ? 1 : 0);
  std::printf("%-8s %5s %6s %10s %10s %7s %10s %9s  %s\n", "measure", "batch", "ctx", "engine_ms", "floor_ms", "ratio",
              "layer_ms", "hf_layer", "floor basis");
  bool any_shared = false;
  for (const Row& r : rows) {
    char hf[16] = "-";
    if (r.hf > 0) std::snprintf(hf, sizeof hf, "%.1f%s", r.hf, r.what == "decode" && r.B == 32 ? "*" : "");
    std::printf("%-8s %5ld %6.0f %10.2f %10.3f %6.1fx %10.2f %9s  %s%s%s\n", r.what.c_str(), long(r.B), r.ctx, r.ms,
                r.floor_ms, r.ms / std::max(r.floor_ms, 1e-9), r.per_layer, hf, r.basis.c_str(),
                r.shared ? " [shared context]" : "", r.impure ? " [some timed steps were not pure decode]" : "");
    any_shared |= r.shared;
  }
  std::printf("\n");
  for (const Row& r : rows)
    if (r.what == "prefill")
      std::printf("prefill: %.0f tokens/s (TTFT %.1f ms for %.0f tokens)\n", r.ms > 0 ? r.ctx / r.ms * 1e3 : 0, r.ms,
                  r.ctx);
  for (const Row& r : rows)
    if (r.what == "decode")
      std::printf("decode B=%ld ctx %.0f%s: %.0f tokens/s\n", long(r.B), r.ctx, r.shared ? " (shared context)" : "",
                  r.ms > 0 ? double(r.B) / r.ms * 1e3 : 0);
  std::printf("layer_ms = step / %ld layers (embedding, head, sampling included); hf_layer: transformers eager "
              "(ANCHORS.md, ctx 4K), * = ctx 1K\n", long(L));
  if (any_shared)
    std::printf("shared context: the batch's requests share one cached context prefix (the same KV blocks), so "
                "attention and the indexer read memory that other sequences of the step also read: an optimistic "
                "figure for attention next to distinct contexts (--calibrate-shared measures the difference)\n");
  if (breakdown) {
    std::ofstream bjs;
    if (!json_path.empty()) bjs.open(json_path, std::ios::app);
    const int64_t P0 = contexts.front();  // the per-op table is for the first context
    if (reps > 0) {
      RunResult r = run(llm, 1, P0, 0, 0, vocab, salt, true);
      char what[64];
      std::snprintf(what, sizeof what, "prefill %ld tokens", long(P0));
      print_breakdown(what, r.ops, 1.0, r.fill_s * 1e3, &bjs, 1);
    }
    for (int64_t B : batches_at.front()) {
      RunResult r = run(llm, B, P0, 2, breakdown_steps, vocab, salt, true);
      char what[64];
      std::snprintf(what, sizeof what, "decode B=%ld ctx %ld", long(B), long(P0));
      print_breakdown(what, r.ops, double(r.decode_s.size()), median(r.decode_s) * 1e3, &bjs, B);
    }
  }
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("bench-flash", "time prefill/decode on a checkpoint against the bandwidth floor",
                    run_bench_flash);
