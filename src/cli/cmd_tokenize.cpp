// `deepinfer tokenize --tokenizer PATH --jsonl IN`: one JSON string per input line -> one JSON
// array of token ids per output line. --add-special-tokens adds BOS (and the post-processor's ids).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/jsonl_io.h"
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
  deepinfer::cli::filter_jsonl(in_path, out_path, [&](const nlohmann::json& j) {
    if (!j.is_string()) DI_THROW(deepinfer::InvalidArgument, "expected a JSON string");
    return nlohmann::json(tok.encode(j.get_ref<const std::string&>(), add_special));
  });
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("tokenize", "text (JSONL strings) -> token ids (JSONL arrays)", run_tokenize);
