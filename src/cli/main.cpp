// `deepinfer <command> [options]`: dispatches to the registered subcommands.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cli/command.h"
#include "deepinfer/error.h"

namespace deepinfer::cli {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace deepinfer::cli

static void usage() {
  auto cmds = deepinfer::cli::registry();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::printf("deepinfer: offline inference for DeepSeek-V4\n\nusage: deepinfer <command> [options]\n\ncommands:\n");
  for (auto& c : cmds) std::printf("  %-20s %s\n", c.name.c_str(), c.summary.c_str());
  std::printf("\n'deepinfer <command> --help' shows a command's options.\n");
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (auto& c : deepinfer::cli::registry()) {
    if (c.name != argv[1]) continue;
    std::string prog = std::string("deepinfer ") + argv[1];
    argv[1] = prog.data();
    try {
      return c.fn(argc - 1, argv + 1);
    } catch (const deepinfer::Error& e) {
      std::fprintf(stderr, "deepinfer %s: error: %s\n", c.name.c_str(), e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "deepinfer %s: unexpected error: %s\n", c.name.c_str(), e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "deepinfer: unknown command '%s'\n\n", argv[1]);
  usage();
  return 2;
}
