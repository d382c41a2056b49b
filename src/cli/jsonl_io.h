// JSONL filter shared by the line-oriented commands (tokenize, detokenize): reads IN ('-' = stdin)
// line by line, parses each non-empty line as JSON, hands it to `fn`, writes fn's result as one
// compact JSON line to OUT ('-' = stdout). Errors name the file and line: a line that is not JSON
// raises InvalidArgument; anything `fn` throws as deepinfer::Error is re-raised with the position
// prefixed, keeping its type's message.
#pragma once
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/check.h"
#include "core/json.h"

namespace deepinfer::cli {

template <typename Fn>  // nlohmann::json fn(const nlohmann::json& line)
void filter_jsonl(const std::string& in_path, const std::string& out_path, Fn&& fn) {
  std::ifstream fin;
  if (in_path != "-") {
    fin.open(in_path, std::ios::binary);
    if (!fin) DI_THROW(InvalidArgument, "cannot open --jsonl ", in_path);
  }
  std::ofstream fout;
  if (out_path != "-") {
    fout.open(out_path, std::ios::binary);
    if (!fout) DI_THROW(InvalidArgument, "cannot write --out ", out_path);
  }
  std::istream& in = in_path == "-" ? std::cin : fin;
  std::ostream& out = out_path == "-" ? std::cout : fout;
  std::string line;
  for (size_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.empty()) continue;
    nlohmann::json j;
    std::string why;
    if (!parse_json_bounded(line, j, &why))  // depth-bounded: fn and dump() recurse per level
      DI_THROW(InvalidArgument, in_path, ":", lineno, ": not valid JSON (", why, ")");
    try {
      out << fn(j).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    } catch (const Error& e) {
      DI_THROW(InvalidArgument, in_path, ":", lineno, ": ", e.what());
    }
  }
}

}  // namespace deepinfer::cli
