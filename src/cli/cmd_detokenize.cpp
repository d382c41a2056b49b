// `deepinfer detokenize --tokenizer PATH --jsonl IN`: one JSON array of ids per input line -> one
// JSON string per output line (lossy like HF: invalid UTF-8 becomes U+FFFD).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/jsonl_io.h"
#include "core/check.h"
#include "core/json.h"
#include "deepinfer/tokenizer.h"

namespace {
int run_detokenize(int argc, char** argv) {
  CLI::App app{"Detokenize JSONL: each line a JSON array of ids, each output line a JSON string"};
  std::string tok_path, in_path = "-", out_path = "-";
  bool skip_special = false;
  app.add_option("--tokenizer", tok_path, "tokenizer.json, its folder, or GPT-2 encoder.json")->required();
  app.add_option("--jsonl", in_path, "input file ('-' = stdin)");
  app.add_option("--out", out_path, "output file ('-' = stdout)");
  app.add_flag("--skip-special-tokens", skip_special, "drop special tokens from the text");
  CLI11_PARSE(app, argc, argv);

  deepinfer::Tokenizer tok = deepinfer::Tokenizer::from_file(tok_path);
  deepinfer::cli::filter_jsonl(in_path, out_path, [&](const nlohmann::json& j) {
    // Each id must be an integer that fits int32: get<std::vector<int32_t>>() would truncate
    // 2^40 to 0 and 3.7 to 3 without a word.
    if (!j.is_array()) DI_THROW(deepinfer::InvalidArgument, "expected a JSON array of ids");
    std::vector<int32_t> ids;
    for (size_t i = 0; i < j.size(); ++i) {
      const nlohmann::json& v = j[i];
      const bool fits = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT32_MAX)) &&
                        v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
      if (!fits)
        DI_THROW(deepinfer::InvalidArgument, "id ", i, " is ", deepinfer::json_snippet(v), ", not an integer token id");
      ids.push_back(int32_t(v.get<int64_t>()));
    }
    return nlohmann::json(tok.decode(ids, skip_special));
  });
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("detokenize", "token ids (JSONL arrays) -> text (JSONL strings)", run_detokenize);
