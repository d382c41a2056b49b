// `deepinfer chat`: interactive chat with streaming output (DeepSeek-V4 chat format).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "cli/engine_flags.h"

namespace {
int run_chat(int argc, char** argv) {
  CLI::App app{"Interactive chat (type /exit to quit, /reset to clear the history)", argv[0]};
  deepinfer::cli::EngineFlags flags;
  flags.sp.temperature = 0.6f;
  flags.add_to(app);
  std::string system;
  bool thinking = false;
  app.add_option("--system", system, "system prompt");
  app.add_flag("--thinking", thinking, "thinking mode (<think>) instead of chat mode");
  CLI11_PARSE(app, argc, argv);

  deepinfer::LLM llm(flags.llm_config());
  std::fprintf(stderr, "%s\n", llm.describe().c_str());
  std::vector<deepinfer::ChatMessage> history;
  if (!system.empty()) history.push_back({"system", system});
  deepinfer::SamplingParams sp = flags.sampling();
  sp.n = 1;
  sp.output_kind = deepinfer::OutputKind::kDelta;  // stream new text as it is decoded
  deepinfer::ChatTemplateOptions co;
  co.thinking = thinking;
  for (std::string line;;) {
    std::printf("\n>>> ");
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      history.resize(system.empty() ? 0 : 1);
      continue;
    }
    if (line.empty()) continue;
    history.push_back({"user", line});
    std::string reply;
    deepinfer::GenerateOptions opts;
    opts.on_output = [&](const deepinfer::RequestOutput& r) {
      if (!r.error.empty()) std::fprintf(stderr, "error: %s\n", r.error.c_str());
      for (auto& o : r.outputs) {
        std::fputs(o.text.c_str(), stdout);
        std::fflush(stdout);
        reply += o.text;
      }
    };
    llm.chat({history}, {sp}, co, opts);
    history.push_back({"assistant", reply});
    auto s = llm.last_summary();
    std::fprintf(stderr, "\n[%lld tokens, TTFT %.0f ms, %.1f tok/s]", (long long)s.num_output_tokens, s.mean_ttft_s * 1e3,
                 s.output_tokens_per_s);
  }
  std::printf("\n");
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("chat", "interactive chat with streaming output", run_chat);
