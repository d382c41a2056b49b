// deepinfer so-check: walks each input's tokens through a structured-output matcher and
// prints one JSON line per input: {"accepted", "compile_ms", "mask_us_mean", ...}.
//
// --inputs FILE.jsonl: each line is a JSON string (the text), or an object
// {"input": "...", "so_args": {...}} overriding --so-args for that line.
// --tokenizer PATH: a tokenizer.json (or folder); "bytes" for a one-token-per-byte vocabulary.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "deepinfer/error.h"
#include "deepinfer/structured.h"
#include "structured/vocab.h"
#ifdef DEEPINFER_HAVE_TOKENIZER
#include "deepinfer/tokenizer.h"
#endif

namespace {

using namespace deepinfer::structured;
using Clock = std::chrono::steady_clock;

// --cpu-clock: this thread's CPU time instead of wall time. On a shared machine a wall-clock
// mask time includes the time slices other processes ran in (a 5 ms slice dwarfs a 200 us
// mask); the thread's CPU time is the mask's own cost.
double now_us(bool cpu) {
  if (!cpu) return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

struct Walk {
  bool accepted = false;
  bool mask_mismatch = false;  // a token's mask bit disagreed with accept_token
  double mask_us_total = 0;
  int64_t masks = 0;
  std::vector<double> mask_us;  // [masks] per-token mask times
  uint64_t mask_hash = 14695981039346656037ull;  // FNV-1a over every mask's words, in order
};

Walk walk(GrammarMatcher& m, const TokenVocabulary& v, const std::vector<int32_t>& ids, std::vector<int32_t>& words,
          bool cpu, bool hash) {
  Walk w;
  auto check = [&](int32_t id) {
    const double t0 = now_us(cpu);
    m.fill_next_token_bitmask(words);
    const double us = now_us(cpu) - t0;
    w.mask_us_total += us;
    w.mask_us.push_back(us);
    ++w.masks;
    if (hash)  // outside the timed part: the whole mask, so a walk change can be checked bit for bit
      for (int32_t x : words) {
        w.mask_hash ^= static_cast<uint32_t>(x);
        w.mask_hash *= 1099511628211ull;
      }
    bool allowed = words[id >> 5] >> (id & 31) & 1;
    bool ok = m.accept_token(id);
    if (allowed != ok) w.mask_mismatch = true;
    return ok;
  };
  for (int32_t id : ids)
    if (!check(id)) return w;
  if (v.stop_ids().empty()) {
    w.accepted = m.can_terminate();
  } else {
    w.accepted = check(v.stop_ids()[0]);
  }
  return w;
}

int run_so_check(int argc, char** argv) {
  CLI::App app{"Check strings against a structured-output constraint"};
  std::string tok_path, so_args, inputs;
  app.add_option("--tokenizer", tok_path, "tokenizer.json / folder, or 'bytes'")->required();
  app.add_option("--so-args", so_args, "so_args JSON, e.g. {\"regex\": \"a+\"}");
  app.add_option("--inputs", inputs, "JSONL file of input strings")->required();
  bool mask_times = false;
  app.add_flag("--mask-times", mask_times, "also print every per-token mask time (us)");
  double precompute_ms = 0;
  app.add_option("--precompute-ms", precompute_ms,
                 "after each fresh compile, fill mask caches for up to this many ms before the first mask "
                 "(as the engine's worker does while the prompt is prefilled); reported as precompute_ms, not timed in the masks")
      ->check(CLI::Range(0.0, 60000.0));
  bool precompute_cpu = false;
  app.add_flag("--precompute-cpu", precompute_cpu,
               "count --precompute-ms in the filling thread's CPU time, not wall time (a loaded machine gives "
               "that thread part of a core; an engine's worker has one)");
  bool mask_hash = false;
  app.add_flag("--mask-hash", mask_hash,
               "also print mask_hash: a hash of every mask of the walk, all bits (to compare two builds' masks)");
  bool cpu_clock = false;
  app.add_flag("--cpu-clock", cpu_clock, "time masks and compiles in this thread's CPU time, not wall time");
  CLI11_PARSE(app, argc, argv);
  try {
    TokenizerInfo info;
    std::function<std::vector<int32_t>(const std::string&)> encode;
    std::shared_ptr<const TokenVocabulary> vocab;
    if (tok_path == "bytes") {
      info = byte_level_tokenizer_info();
    } else {
#ifdef DEEPINFER_HAVE_TOKENIZER
      auto tok = std::make_shared<deepinfer::Tokenizer>(deepinfer::Tokenizer::from_file(tok_path));
      info = tokenizer_info_from(*tok);
      encode = [tok](const std::string& s) { return tok->encode(s, false); };
#else
      std::fprintf(stderr, "so-check: built without the tokenizer module; use --tokenizer bytes\n");
      return 2;
#endif
    }
    vocab = make_vocabulary(std::move(info));
    if (!encode)
      encode = [vocab](const std::string& s) { return greedy_tokenize(*vocab, s).value_or(std::vector<int32_t>{}); };
    GrammarCompiler compiler(vocab);
    std::ifstream in(inputs);
    if (!in) throw deepinfer::InvalidArgument("cannot open --inputs " + inputs);
    std::vector<int32_t> words((vocabulary_size(*vocab) + 31) / 32);
    std::map<std::string, std::shared_ptr<const CompiledGrammar>> compiled;
    std::deque<std::string> order;  // compiled's keys, oldest first
    std::string line;
    for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
      if (line.empty()) continue;
      nlohmann::json out;
      try {
        // so_args nested past the grammar's limit would overflow the stack in parse/dump below.
        if (json_nesting_depth(line) > kMaxSoArgsDepth + 2)
          throw deepinfer::InvalidArgument("line " + std::to_string(lineno) + ": nests deeper than " +
                                           std::to_string(kMaxSoArgsDepth) + " levels");
        auto j = nlohmann::ordered_json::parse(line);
        std::string text = j.is_string() ? j.get<std::string>() : j.at("input").get<std::string>();
        std::string args = j.is_object() && j.contains("so_args") ? j["so_args"].dump() : so_args;
        // Lines sharing so_args reuse the compiled grammar (and its warm mask caches), as a
        // server would; compile_ms is reported for the first line only.
        const double t0 = now_us(cpu_clock);
        bool cached = compiled.count(args) > 0;
        if (!cached) compiled[args] = compiler.compile_uncached(args);
        auto g = compiled[args];
        out["compile_ms"] = cached ? 0.0 : (now_us(cpu_clock) - t0) * 1e-3;
        if (cached) out["cached"] = true;
        if (!cached && precompute_ms > 0) {
          // On a thread of its own, joined before the first mask: as a worker of the engine's
          // StructuredWorkers would, with its own CPU clock (and glibc malloc arena).
          MaskPrecomputeResult pr;
          double pre_ms = 0;
          std::thread([&] {
            const double p0 = now_us(cpu_clock);
            pr = g->precompute_masks({.time_budget_ms = precompute_ms, .thread_cpu_budget = precompute_cpu});
            pre_ms = (now_us(cpu_clock) - p0) * 1e-3;
          }).join();
          out["precompute_ms"] = pre_ms;
          out["precompute_states"] = pr.states;
          out["precompute_pairs"] = pr.pairs;
          out["precompute_bytes"] = pr.bytes;
          out["precompute_complete"] = pr.complete;
        }
        // Oldest first, one at a time, as GrammarCompiler's cache evicts: freeing 64 grammars
        // at once made the next mask pay for glibc consolidating all their freed chunks
        // (3-7 ms on every 65th grammar of MaskBench-dev, none of it the mask's own work).
        if (!cached) order.push_back(args);
        if (compiled.size() > 64) {
          compiled.erase(order.front());
          order.pop_front();
        }
        GrammarMatcher m(g);
        Walk w = walk(m, *vocab, encode(text), words, cpu_clock, mask_hash);
        out["accepted"] = w.accepted;
        out["mask_us_mean"] = w.masks ? w.mask_us_total / w.masks : 0.0;
        if (w.mask_mismatch) out["mask_mismatch"] = true;
        if (mask_times) out["mask_us"] = w.mask_us;
        if (mask_hash) {
          char hex[17];
          std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(w.mask_hash));
          out["mask_hash"] = hex;
        }
      } catch (const deepinfer::Error& e) {
        out["accepted"] = false;
        out["error"] = e.what();
      } catch (const nlohmann::json::exception& e) {
        out["accepted"] = false;
        out["error"] = std::string("line ") + std::to_string(lineno) + ": " + e.what();
      }
      std::cout << out.dump() << "\n";
    }
  } catch (const deepinfer::Error& e) {
    std::fprintf(stderr, "so-check: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace
DI_REGISTER_COMMAND("so-check", "check strings against a regex / JSON schema / EBNF constraint", run_so_check);
