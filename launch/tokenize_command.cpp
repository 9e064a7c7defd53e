// `linnet-tp tokenize`: every rank reads and tokenizes the input in a load phase (no
// collectives), so an error is reported once; rank 0 prints. The whole output is built
// before anything is printed, so a bad line in --input leaves no partial output.
#include "launch/tokenize_command.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "launch/cli_parse.h"
#include "driver/job.h"
#include "loader/model_path.h"
#include "loader/tokenizer/tokenizer.h"

namespace linnet {
namespace {

std::string ids_line(const std::vector<int32_t>& ids) {
  std::string s;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s;
}

std::string tokenize_all(const TokenizeOptions& o) {
  const Tokenizer tok = Tokenizer::from_dir(resolve_model_dir(o.model));
  if (o.text) {
    try {
      return ids_line(tok.encode(*o.text, o.add_special)) + "\n";
    } catch (const Error& e) {
      throw e.at("--text");
    }
  }
  std::ifstream in(o.input, std::ios::binary);
  if (!in) throw Error("cannot open the input file", o.input);
  std::string out;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = o.input + ":" + std::to_string(line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(std::string("not valid JSON: ") + e.what(), where);
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
      throw Error("each line must be an object with a string \"text\"", where);
    }
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(j["text"].get<std::string>(), o.add_special);
    } catch (const Error& e) {
      throw e.at(where);
    }
    out += nlohmann::json{{"ids", ids}}.dump() + "\n";
  }
  return out;
}

}  // namespace

std::optional<TokenizeOptions> parse_tokenize_options(int argc, char** argv, std::string& help_text) {
  cxxopts::Options opts("linnet-tp tokenize",
                        "Prints the token ids of text with a model directory's tokenizer.json\n"
                        "(no weights are loaded; no mpirun needed). No special tokens are added\n"
                        "unless --add-special.\n");
  opts.custom_help("--model DIR (--text STR | --input FILE.jsonl) [--add-special]");
  // clang-format off
  opts.add_options()
    ("model", "Model directory (tokenizer.json, optionally tokenizer_config.json)",
     cxxopts::value<std::string>())
    ("text", "One text; prints its ids separated by spaces", cxxopts::value<std::string>())
    ("input", "JSONL file, one {\"text\": ...} per line; prints one {\"ids\": [...]} line each, "
     "in order", cxxopts::value<std::string>())
    ("add-special", "Add the tokenizer's special tokens (e.g. BOS), as encode(add_special_tokens=True)")
    ("h,help", "Print this help and exit");
  // clang-format on
  const auto parsed = parse_options(opts, argc, argv, "tokenize", help_text);
  if (!parsed) return std::nullopt;
  const cxxopts::ParseResult& r = *parsed;
  TokenizeOptions o;
  if (!r.count("model")) throw Error("is required", "--model");
  o.model = r["model"].as<std::string>();
  if (r.count("text") > 1 || r.count("input") > 1) throw Error("given more than once", "--text/--input");
  if (r.count("text")) o.text = r["text"].as<std::string>();
  if (r.count("input")) o.input = r["input"].as<std::string>();
  if (!o.text && o.input.empty()) throw Error("give --text STR or --input FILE.jsonl", "--text");
  if (o.text && !o.input.empty()) throw Error("give only one of --text and --input", "--input");
  o.add_special = r.count("add-special") > 0;
  return o;
}

int run_tokenize(const TokenizeOptions& options, Job& job) {
  std::string out;
  if (!job.load_phase([&] { out = tokenize_all(options); })) return kLoadErrorExit;
  if (job.rank() == 0) {
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace linnet
