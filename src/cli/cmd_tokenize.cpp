// `deepinfer tokenize --tokenizer PATH --jsonl IN`: one JSON string per input line -> one JSON
// array of token ids per output line. --add-special-tokens adds BOS (and the post-processor's ids).
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/check.h"
#include "deepinfer/tokenizer.h"

namespace {
int run_tokenize(int argc, char** argv) {
  CLI::App app{"Tokenize JSONL: each line a JSON string, each output line a JSON array of ids"};
  std::string tok_path, in_path = "-", out_path = "-";
  bool add_special = false;
  app.add_option("--tokenizer", tok_path, "tokenizer.json, its folder, or GPT-2 encoder.json")->required();
  app.add_option("--jsonl", in_path, "input file ('-' = stdin)");
  app.add_option("--out", out_path, "output file ('-' = stdout)");
  app.add_flag("--add-special-tokens", add_special, "add BOS / post-processor tokens");
  CLI11_PARSE(app, argc, argv);

  deepinfer::Tokenizer tok = deepinfer::Tokenizer::from_file(tok_path);
  std::ifstream fin;
  if (in_path != "-") {
    fin.open(in_path, std::ios::binary);
    if (!fin) DI_THROW(deepinfer::InvalidArgument, "cannot open --jsonl ", in_path);
  }
  std::istream& in = in_path == "-" ? std::cin : fin;
  std::ofstream fout;
  if (out_path != "-") fout.open(out_path, std::ios::binary);
  std::ostream& out = out_path == "-" ? std::cout : fout;

  std::string line;
  for (size_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      DI_THROW(deepinfer::InvalidArgument, in_path, ":", lineno, ": not valid JSON (", e.what(), ")");
    }
    if (!j.is_string()) DI_THROW(deepinfer::InvalidArgument, in_path, ":", lineno, ": expected a JSON string");
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(j.get_ref<const std::string&>(), add_special);
    } catch (const deepinfer::TokenizerError& e) {
      DI_THROW(deepinfer::TokenizerError, in_path, ":", lineno, ": ", e.what());
    }
    out << nlohmann::json(ids).dump() << '\n';
  }
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("tokenize", "text (JSONL strings) -> token ids (JSONL arrays)", run_tokenize);
