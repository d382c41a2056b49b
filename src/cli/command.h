// Subcommands of the `deepinfer` executable. Each lives in its own cmd_<name>.cpp and
// registers itself with DI_REGISTER_COMMAND, so adding a command never edits main.cpp.
// A command parses its own arguments (CLI11) and returns the process exit code.
#pragma once
#include <string>
#include <vector>

namespace deepinfer::cli {

using CommandFn = int (*)(int argc, char** argv);  // argv[0] is "deepinfer <name>"

struct Command {
  std::string name;
  std::string summary;
  CommandFn fn;
};

std::vector<Command>& registry();

struct Registrar {
  Registrar(const char* name, const char* summary, CommandFn fn) { registry().push_back({name, summary, fn}); }
};

}  // namespace deepinfer::cli

#define DI_REGISTER_COMMAND(name, summary, fn) \
  static ::deepinfer::cli::Registrar di_cli_registrar_##fn(name, summary, fn)
