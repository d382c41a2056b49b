#include <cstdio>

#include "cli/command.h"

namespace {
int run_version(int, char**) {
  std::printf("deepinfer 0.1.0\n");
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("version", "print the version", run_version);
