// `deepinfer generate`: offline generation for one or many prompts, with a progress bar and
// a summary (requests, tokens, TTFT, TPOT, tokens/s). --chat renders each prompt as a user turn in
// the model's chat format (LLM::chat_prompt: V4's, or V4.1's for a DeepseekV41ForCausalLM folder).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "core/check.h"

namespace {
int run_generate(int argc, char** argv) {
  CLI::App app{"Generate text for one or more prompts", argv[0]};
  deepinfer::cli::EngineFlags flags;
  flags.add_to(app);
  std::vector<std::string> prompts;
  std::string prompts_file;
  bool quiet = false, chat = false, thinking = false;
  app.add_option("-p,--prompt", prompts, "prompt text (repeatable)");
  app.add_flag("--chat", chat,
               "each prompt is one user message, rendered in the model's chat format (DeepSeek-V4 or V4.1, "
               "from config.json's architecture)");
  app.add_flag("--thinking", thinking, "with --chat: thinking mode instead of chat mode");
  app.add_option("--prompts-file", prompts_file, "file with one prompt per line");
  app.add_flag("-q,--quiet", quiet, "print only the summary");
  CLI11_PARSE(app, argc, argv);
  if (!prompts_file.empty()) {
    std::ifstream f(prompts_file);
    if (!f) DI_THROW(deepinfer::InvalidArgument, "--prompts-file '", prompts_file, "' cannot be read");
    for (std::string line; std::getline(f, line);)
      if (!line.empty()) prompts.push_back(line);
  }
  if (prompts.empty()) DI_THROW(deepinfer::InvalidArgument, "give at least one --prompt or --prompts-file");

  deepinfer::LLM llm(flags.llm_config());
  std::fprintf(stderr, "%s\n", llm.describe().c_str());
  std::vector<deepinfer::PromptInput> inputs;
  for (auto& p : prompts) {
    if (!chat) {
      inputs.push_back(deepinfer::PromptInput::from_text(p));
      continue;
    }
    deepinfer::ChatTemplateOptions co;
    co.thinking = thinking;
    inputs.push_back(deepinfer::PromptInput::from_text(llm.chat_prompt({{"user", p}}, co)));
  }
  deepinfer::GenerateOptions opts;
  opts.progress_bar = prompts.size() > 1;
  auto outs = llm.generate(inputs, {flags.sampling()}, opts);
  int failed = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].error.empty()) {
      std::fprintf(stderr, "prompt %zu rejected: %s\n", i, outs[i].error.c_str());
      ++failed;
      continue;
    }
    if (quiet) continue;
    for (auto& o : outs[i].outputs)
      std::printf("--- prompt %zu%s: %s\n%s\n[%zu tokens, finish: %s]\n", i,
                  outs[i].outputs.size() > 1 ? (" sample " + std::to_string(o.index)).c_str() : "",
                  prompts[i].c_str(), o.text.c_str(), o.token_ids.size(), o.finish_reason.c_str());
  }
  std::printf("\n%s\n", llm.last_summary().str().c_str());
  return failed == int(outs.size()) ? 1 : 0;
}
}  // namespace
DI_REGISTER_COMMAND("generate", "generate text for prompts (offline, batched)", run_generate);
