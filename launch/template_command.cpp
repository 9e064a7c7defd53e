// `linnet-tp template`: every rank renders the input in a load phase (no collectives), so
// an error is reported once; rank 0 prints. The whole output is built before anything is
// printed, so a bad line leaves no partial output. Lines are parsed keeping their key
// order, which `tojson` of tools shows.
#include "launch/template_command.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "launch/cli_parse.h"
#include "driver/job.h"
#include "requests/jsonl_input.h"
#include "loader/model_path.h"
#include "loader/chat/chat_template.h"
#include "loader/tokenizer/tokenizer.h"

namespace linnet {
namespace {

std::string render_all(const TemplateOptions& o) {
  const std::filesystem::path dir = resolve_model_dir(o.model);
  const Tokenizer tok = Tokenizer::from_dir(dir);
  const ModelChatTemplate chat = load_chat_template(tok, dir);
  std::string out;
  for (const auto& [line_no, line] : read_jsonl_lines(o.input)) {
    const std::string where = o.input + ":" + std::to_string(line_no);
    const nlohmann::ordered_json request = parse_jsonl_line(line, where);
    std::string text;
    try {
      text = chat.chat_template.render(chat_variables(request, chat.special_tokens, where));
    } catch (const Error& e) {
      throw e.at(where);
    }
    out += nlohmann::json{{"text", text}}.dump() + "\n";
  }
  return out;
}

}  // namespace

std::optional<TemplateOptions> parse_template_options(int argc, char** argv, std::string& help_text) {
  cxxopts::Options opts("linnet-tp template",
                        "Renders chat messages into prompt text with the model's own chat template\n"
                        "(tokenizer_config.json \"chat_template\" or chat_template.jinja), as\n"
                        "transformers' apply_chat_template(tokenize=False) does. No weights are\n"
                        "loaded; no mpirun needed.\n");
  opts.custom_help("--model DIR --input FILE.jsonl");
  // clang-format off
  opts.add_options()
    ("model", "Model directory (tokenizer.json, tokenizer_config.json with a chat_template)",
     cxxopts::value<std::string>())
    ("input", "JSONL file, one {\"messages\": [...], \"add_generation_prompt\": true, ...} per line "
     "(other keys such as tools, enable_thinking, date_string go to the template); prints one "
     "{\"text\": ...} line each, in order", cxxopts::value<std::string>())
    ("h,help", "Print this help and exit");
  // clang-format on
  const auto parsed = parse_options(opts, argc, argv, "template", help_text);
  if (!parsed) return std::nullopt;
  const cxxopts::ParseResult& r = *parsed;
  TemplateOptions o;
  if (!r.count("model")) throw Error("is required", "--model");
  o.model = r["model"].as<std::string>();
  if (!r.count("input")) throw Error("is required", "--input");
  if (r.count("input") > 1) throw Error("given more than once", "--input");
  o.input = r["input"].as<std::string>();
  return o;
}

int run_template(const TemplateOptions& options, Job& job) {
  std::string out;
  if (!job.load_phase([&] { out = render_all(options); })) return kLoadErrorExit;
  if (job.rank() == 0) {
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace linnet
