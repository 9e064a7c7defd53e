// Chat templates: the real templates of the seed models (and Phi-3.5) render
// byte-identical to Jinja2 with transformers' conventions (goldens from
// scripts/make_chat_fixtures.py), small templates cover the interpreter's corners, and
// unsupported or malformed templates fail naming the line and the construct.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "loader/chat/chat_template.h"
#include "loader/tokenizer/tokenizer.h"
#include "tests/cli_harness.h"
#include "tests/test_data.h"
#include "tests/test_helpers.h"

namespace linnet {
namespace {

using linnet::test::read_file;

using ojson = nlohmann::ordered_json;

std::filesystem::path golden_dir() { return test::test_data_dir() / "chat_templates"; }

std::vector<ojson> read_jsonl(const std::filesystem::path& p) {
  std::vector<ojson> rows;
  std::istringstream in(read_file(p));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) rows.push_back(ojson::parse(line));
  }
  return rows;
}

// Renders every golden row; a row with "error" must throw, and a template's own
// raise_exception message must be kept.
void check_rows(const ChatTemplate& t, const std::vector<ojson>& rows, const std::string& label) {
  for (const ojson& row : rows) {
    const std::string name = row.contains("name") ? row["name"].get<std::string>() : row["template"].get<std::string>();
    SCOPED_TRACE(label + ": " + name);
    if (row.contains("error")) {
      try {
        const std::string text = t.render(row["variables"]);
        ADD_FAILURE() << "expected an error like '" << row["error"].get<std::string>() << "', rendered: " << text;
      } catch (const Error& e) {
        if (row["error_kind"] == "raise_exception") {
          EXPECT_NE(std::string(e.what()).find(row["error"].get<std::string>()), std::string::npos) << e.what();
        }
        EXPECT_NE(std::string(e.what()).find(" line "), std::string::npos) << e.what();
      }
      continue;
    }
    std::string text;
    ASSERT_NO_THROW(text = t.render(row["variables"]));
    EXPECT_EQ(text, row["text"].get<std::string>());
  }
}

class RealTemplate : public ::testing::TestWithParam<const char*> {};

TEST_P(RealTemplate, MatchesJinja2) {
  const std::string name = GetParam();
  const ChatTemplate t = ChatTemplate::parse(read_file(golden_dir() / (name + ".jinja")), name + ".jinja");
  const std::vector<ojson> rows = read_jsonl(golden_dir() / (name + ".jsonl"));
  EXPECT_GE(rows.size(), 12u);
  check_rows(t, rows, name);
}

INSTANTIATE_TEST_SUITE_P(ChatTemplates, RealTemplate,
                         ::testing::Values("llama-3.1-8b-instruct", "qwen3", "phi-3-mini-4k-instruct",
                                           "phi-3.5-mini-instruct"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) {
                             if (c == '-' || c == '.') c = '_';
                           }
                           return s;
                         });

TEST(ChatTemplate, SnippetsMatchJinja2) {
  for (const ojson& row : read_jsonl(golden_dir() / "snippets.jsonl")) {
    const std::string source = row["template"].get<std::string>();
    SCOPED_TRACE(source);
    ChatTemplate t;
    ASSERT_NO_THROW(t = ChatTemplate::parse(source, "snippet"));
    check_rows(t, {row}, "snippet");
  }
}

// The copies in tests/data are the templates the model cards carry in tokenizer_config.json.
TEST(ChatTemplate, ModelCardsCarryTheSameTemplates) {
  const auto cards = test::shared_dir() / "models" / "cards";
  if (!std::filesystem::exists(cards)) GTEST_SKIP() << "no " << cards;
  for (const auto& [card, name] : std::vector<std::pair<std::string, std::string>>{
           {"llama-3.1-8b-instruct", "llama-3.1-8b-instruct"}, {"qwen3-4b", "qwen3"},
           {"phi-3-mini-4k-instruct", "phi-3-mini-4k-instruct"}}) {
    SCOPED_TRACE(card);
    const ojson config = ojson::parse(read_file(cards / card / "tokenizer_config.json"));
    std::string golden = read_file(golden_dir() / (name + ".jinja"));
    std::string from_card = config["chat_template"].get<std::string>();
    // Jinja2 drops one trailing newline of the source, so the two render alike either way.
    while (!golden.empty() && golden.back() == '\n') golden.pop_back();
    while (!from_card.empty() && from_card.back() == '\n') from_card.pop_back();
    EXPECT_EQ(from_card, golden);
  }
}

// Through the tokenizer (its chat_template() and BOS / EOS strings) as the CLI does it.
TEST(ChatTemplate, TokenizerTemplateWithChatVariables) {
  const auto dir = test::shared_dir() / "models" / "cards" / "phi-3-mini-4k-instruct";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir;
  const Tokenizer tok = Tokenizer::from_dir(dir);
  ASSERT_FALSE(tok.chat_template().empty());
  ChatSpecialTokens special;
  if (auto id = tok.bos_token_id()) special.bos_token = tok.id_to_token(*id);
  if (auto id = tok.eos_token_id()) special.eos_token = tok.id_to_token(*id);
  EXPECT_EQ(special.bos_token.value_or(""), "<s>");
  const ChatTemplate t = ChatTemplate::parse(tok.chat_template(), "tokenizer_config.json");
  const ojson request = ojson::parse(R"({"messages": [{"role": "user", "content": "Hello!"}],
                                         "add_generation_prompt": true})");
  const std::vector<ojson> rows = read_jsonl(golden_dir() / "phi-3-mini-4k-instruct.jsonl");
  EXPECT_EQ(t.render(chat_variables(request, special, "request")), rows.at(0)["text"].get<std::string>());
}

TEST(ChatTemplate, ChatVariablesFollowTransformers) {
  const ojson request = ojson::parse(R"({"messages": [{"role": "user", "content": "x"}], "enable_thinking": false})");
  const ojson v = chat_variables(request, {std::string("<s>"), std::nullopt}, "r");
  EXPECT_EQ(v["bos_token"], "<s>");
  EXPECT_FALSE(v.contains("eos_token"));
  EXPECT_TRUE(v["tools"].is_null());
  EXPECT_TRUE(v["documents"].is_null());
  EXPECT_EQ(v["add_generation_prompt"], false);
  EXPECT_EQ(v["enable_thinking"], false);
  EXPECT_THROW(chat_variables(ojson::parse(R"({"prompt": "x"})"), {}, "r"), Error);
  EXPECT_THROW(chat_variables(ojson::parse(R"({"messages": ["x"]})"), {}, "r"), Error);
  EXPECT_THROW(chat_variables(ojson::parse(R"({"messages": [], "add_generation_prompt": 1})"), {}, "r"), Error);
}

// Acceptance 2: an unsupported construct is an error naming its line and the construct.
TEST(ChatTemplate, UnsupportedConstructsNameTheLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"line one\n{% if x %}\n{% include 'other.jinja' %}\n{% endif %}", "line 3"},
      {"a\nb\n{{ x | wordwrap(10) }}", "line 3"},
      {"{{ x }}\n{{ x is sameas_not_a_test }}", "line 2"},
      {"\n\n\n{% for x in xs recursive %}{% endfor %}", "line 4"},
      {"{% extends 'base' %}", "line 1"},
      {"{% filter upper %}x{% endfilter %}", "line 1"},
      {"{% call foo() %}x{% endcall %}", "line 1"},
      {"x\n{% frobnicate %}", "line 2"},
  };
  for (const auto& [source, line] : cases) {
    SCOPED_TRACE(source);
    try {
      ChatTemplate::parse(source, "t.jinja");
      ADD_FAILURE() << "parsed";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("t.jinja " + line), std::string::npos) << what;
      EXPECT_NE(what.find("unsupported Jinja construct"), std::string::npos) << what;
    }
  }
}

TEST(ChatTemplate, MalformedTemplatesNameTheLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{% if x %}\nno end", "missing '{% endif %}'"},
      {"a\n{{ x ", "unclosed tag"},
      {"a\n\n{# never closed", "missing end of comment"},
      {"{{ 'unterminated }}", "unterminated string"},
      {"{{ x + }}", "syntax error"},
      {"{% for x %}{% endfor %}", "expected 'in'"},
      {"{% endfor %}", "unknown statement"},
      {"{{ (1, }}", "syntax error"},
  };
  for (const auto& [source, what_part] : cases) {
    SCOPED_TRACE(source);
    try {
      ChatTemplate::parse(source, "t.jinja");
      ADD_FAILURE() << "parsed";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(what_part), std::string::npos) << what;
      EXPECT_NE(what.find("t.jinja line "), std::string::npos) << what;
    }
  }
}

TEST(ChatTemplate, RuntimeErrorsNameTheLine) {
  const ChatTemplate t = ChatTemplate::parse("ok\n{{ raise_exception('Roles must alternate') }}", "t.jinja");
  try {
    t.render(ojson::object());
    ADD_FAILURE() << "rendered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.jinja line 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Roles must alternate"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatTemplate::parse("{{ 1 // 0 }}").render(ojson::object()), Error);
  EXPECT_THROW(ChatTemplate::parse("{{ none.x.y }}").render(ojson::object()), Error);
  EXPECT_THROW(ChatTemplate::parse("{% for x in 3 %}{% endfor %}").render(ojson::object()), Error);
  EXPECT_THROW(ChatTemplate::parse("{{ x | tojson }}").render(ojson::object()), Error);
}

TEST(ChatTemplate, StrftimeNowGivesTheCurrentYear) {
  const std::string year = ChatTemplate::parse("{{ strftime_now('%Y') }}").render(ojson::object());
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

// Deep or hostile inputs must fail cleanly, not crash.
TEST(ChatTemplate, GarbageTemplatesFailCleanly) {
  const std::vector<std::string> sources = {"{{", "{%", "{#", "{{ }}", "{% %}", "{{ [ }}", "{{ x[ }}", "{{ x.1.2 }}",
                                            "{% set %}", "{% macro %}", "{{ 'a' 'b' | }}", "{{ x is }}", "}}", "%}"};
  for (const std::string& s : sources) {
    SCOPED_TRACE(s);
    try {
      ChatTemplate::parse(s).render(ojson::object());
    } catch (const Error&) {
    }
  }
}

// Issue 14: templates that would overflow the stack, exhaust memory or run for minutes
// are refused by the interpreter's limits (loader/chat/jinja.h), naming the template and line.
TEST(ChatTemplate, HostileTemplatesHitTheLimits) {
  const auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int k = 0; k < n; ++k) out += s;
    return out;
  };
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      // {source, line, what}
      {"x\n{{ " + repeat("(", 100000) + "1" + repeat(")", 100000) + " }}", "line 2", "nests deeper than 256"},
      {repeat("{% if true %}", 20000) + repeat("{% endif %}", 20000), "line 1", "nests deeper than 256"},
      {"{{ " + repeat("[", 100000) + repeat("]", 100000) + " }}", "line 1", "nests deeper than 256"},
      {"{{ 1" + repeat(" + 1", 100000) + " }}", "line 1", "nests deeper than 256"},
      {"{{ x" + repeat(".a", 100000) + " }}", "line 1", "nests deeper than 256"},
      {"{{ x" + repeat("|string", 100000) + " }}", "line 1", "nests deeper than 256"},
      {"{{ " + repeat("not ", 100000) + "x }}", "line 1", "nests deeper than 256"},
      {"{{ " + repeat("- ", 100000) + "1 }}", "line 1", "nests deeper than 256"},
      {"{{ 1" + repeat(" if x else 1", 100000) + " }}", "line 1", "nests deeper than 256"},
      {"{% macro f() %}\n{{ f() }}{% endmacro %}{{ f() }}", "line 2", "macro calls nested deeper than 256"},
      // A macro nesting ~200 levels that also recurses: bounded by the evaluation depth.
      {"{% macro f(n) %}" + repeat("{% if true %}", 200) + "{{ f(n + 1) }}" + repeat("{% endif %}", 200) +
           "{% endmacro %}{{ f(0) }}",
       "line 1", "nests evaluation deeper than 1024"},
      {"\n{{ 'a' * 100000000000 }}", "line 2", "the result of '*' would be longer than 16777216 bytes"},
      {"{{ 100000000000 * 'ab' }}", "line 1", "the result of '*' would be longer than 16777216 bytes"},
      {"{{ [1, 2] * 100000000000 }}", "line 1", "the result of '*' would be longer than 1048576 items"},
      {"{% set l = [1] * 600000 %}{{ (l + l) | length }}", "line 1",
       "the result of '+' would have more than 1048576 items"},
      {"{% for i in range(100000) %}\n{% for j in range(100000) %}{% endfor %}{% endfor %}", "line 2",
       "more than 10000000 evaluation steps"},
      {"{% macro f() %}{% endmacro %}{% for i in range(100000) %}{% for j in range(100) %}{{ f() }}{% endfor %}"
       "{% endfor %}",
       "line 1", "more than 10000000 evaluation steps"},
      {"{% set s = 'a' * 16000000 %}{{ s }}\n{{ s }}", "line 2", "the template output would be longer than 16777216"},
      {"{% set s = 'a' * 16000000 %}{% set t %}{{ s }}{{ s }}{% endset %}", "line 1", "the template output"},
      {"{% set ns = namespace(s='a') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "line 1",
       "the result of '~' would be longer than 16777216"},
      {"{% set ns = namespace(s='a') %}{% for i in range(30) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "line 1",
       "the result of '+' would be longer than 16777216"},
      {"{{ ('a' * 1000000).replace('a', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb') }}", "line 1",
       "the result of replace() would be longer"},
      {"{{ ('a' * 1000).join(['x' * 100000] * 1000) }}", "line 1", "the result of join() would be longer"},
      {"{{ (['x' * 100000] * 1000) | join('y' * 100000) }}", "line 1", "the result of join would be longer"},
      {"{{ [[[1]]] | tojson(indent=100000000) }}", "line 1", "the result of tojson would be longer"},
      {"{{ range(1000000) }}", "line 1", "range() too big (more than 100000 items)"},
      {"{% for c in 'a' * 16000000 %}{% endfor %}", "line 1", "more than 10000000 evaluation steps"},
      // Cheap steps on big data: bounded by the bytes copied.
      {"{% set s = 'a' * 10000000 %}{% for i in range(1000) %}\n{% set t = s ~ '' %}{% endfor %}", "line 2",
       "copies more than 1073741824 bytes"},
      {"{% set ns = namespace(l=['a' * 10000000]) %}{% for i in range(20) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
       "line 1", "copies more than 1073741824 bytes"},
      {"{{ ['a' * 10000000] * 1000 }}", "line 1", "copies more than 1073741824 bytes"},
      // int64 arithmetic past its range (Python's ints would grow): an error, not a wrap or a trap.
      {"{{ 9223372036854775807 + 1 }}", "line 1", "integer overflow in '+'"},
      {"{{ -9223372036854775807 - 2 }}", "line 1", "integer overflow in '-'"},
      {"{{ 4294967296 * 4294967296 }}", "line 1", "integer overflow in '*'"},
      {"{{ 2 ** 64 }}", "line 1", "integer overflow in '**'"},
      {"{{ (-9223372036854775807 - 1) // -1 }}", "line 1", "integer overflow in '//'"},
      {"{{ -(-9223372036854775807 - 1) }}", "line 1", "integer overflow in '-'"},
      {"{{ (-9223372036854775807 - 1) | abs }}", "line 1", "integer overflow in 'abs'"},
      {"{{ 1e300 | int }}", "line 1", "does not fit in 64 bits"},
  };
  for (const auto& [source, line, what_part] : cases) {
    SCOPED_TRACE(source.substr(0, 120));
    try {
      ChatTemplate::parse(source, "t.jinja").render(ojson::object());
      ADD_FAILURE() << "rendered";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("t.jinja " + line + ": "), std::string::npos) << what.substr(0, 300);
      EXPECT_NE(what.find(what_part), std::string::npos) << what.substr(0, 300);
    }
  }
  // Within the limits: a big exponent is computed by squaring (it wraps like int64), and
  // nesting that real templates use parses.
  EXPECT_EQ(ChatTemplate::parse("{{ 1 ** 100000000000000 }} {{ (-1) ** 100000000000001 }} {{ 3 ** 39 }}")
                .render(ojson::object()),
            "1 -1 4052555153018976267");
  EXPECT_EQ(ChatTemplate::parse("{{ (-9223372036854775807 - 1) % -1 }} {{ (-9223372036854775807 - 1) is "
                                "divisibleby(-1) }} {{ 'abc'[1::9223372036854775807] }} "
                                "{{ range(0, 9223372036854775807, 4611686018427387904) | list }}")
                .render(ojson::object()),
            "0 True b [0, 4611686018427387904]");
  EXPECT_EQ(ChatTemplate::parse("{{ " + repeat("(", 200) + "1" + repeat(")", 200) + " }}").render(ojson::object()), "1");
  EXPECT_EQ(ChatTemplate::parse(repeat("{% if true %}", 200) + "x" + repeat("{% endif %}", 200)).render(ojson::object()),
            "x");
  EXPECT_EQ(ChatTemplate::parse("{{ 'ab' * 3 }}{{ [1] * 2 }}{{ 'a' * -1 }}{{ [1] * 0 }}").render(ojson::object()),
            "ababab[1, 1][]");
  // A namespace that holds itself prints as Python does ({...}), not until the stack ends.
  EXPECT_EQ(ChatTemplate::parse("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{% set ns.l = [ns] %}{{ ns }}")
                .render(ojson::object()),
            "<Namespace {'a': 1, 'me': <Namespace {...}>, 'l': [<Namespace {...}>]}>");
}

// Output that is not UTF-8 (here bytes of the template itself) is an error naming the
// template, not the JSON writer's error naming no file.
TEST(ChatTemplate, OutputThatIsNotUtf8NamesTheTemplate) {
  for (const std::string source : {"ok \xff", "{{ 'a\xc3' }}", "\xed\xa0\x80"}) {
    try {
      ChatTemplate::parse(source, "t.jinja").render(ojson::object());
      ADD_FAILURE() << "rendered";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("t.jinja: the rendered text is not valid UTF-8", 0), 0u) << what;
    }
  }
  EXPECT_EQ(ChatTemplate::parse("h\xc3\xa9 {{ 'h\xc3\xa9'[1] }}").render(ojson::object()), "h\xc3\xa9 \xc3\xa9");
}

// A template from chat_template.jinja is named by that file in errors, even when a
// tokenizer_config.json (without a chat_template) is beside it.
TEST(ChatTemplate, ErrorsNameTheJinjaFileTheTemplateCameFrom) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("linnet_jinja_source_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() { fs::remove_all(dir); }
  } cleanup{dir};
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(test::stories_dir() / file, dir / file);
  }
  const auto message = [&] {
    try {
      const Tokenizer tok = Tokenizer::from_dir(dir);
      load_chat_template(tok, dir).chat_template.render(ojson::object());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::ofstream(dir / "chat_template.jinja") << "x\n{% frobnicate %}";
  std::string what = message();
  EXPECT_EQ(what.rfind((dir / "chat_template.jinja").string() + " line 2: unsupported Jinja construct", 0), 0u) << what;
  std::ofstream(dir / "chat_template.jinja") << "x\n\n{{ raise_exception('no') }}";
  what = message();
  EXPECT_EQ(what.rfind((dir / "chat_template.jinja").string() + " line 3: the template raised", 0), 0u) << what;
  // From tokenizer_config.json, that file names it.
  nlohmann::json config = test::read_json(test::stories_dir() / "tokenizer_config.json");
  config["chat_template"] = "{{ raise_exception('no') }}";
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  what = message();
  EXPECT_EQ(what.rfind((dir / "tokenizer_config.json").string() + " chat_template line 1: the template raised", 0), 0u)
      << what;
}

// --- the linnet-tp executable: `template` and `generate --chat` -------------------------
// (run directly, no mpirun: an MPI singleton; skipped when LINNET_BIN is not built)

namespace fs = std::filesystem;

using test::quote;
using CliResult = test::Result;

class ChatCli : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = test::env_path("LINNET_BIN");
    if (bin_.empty() || !fs::exists(bin_)) GTEST_SKIP() << "LINNET_BIN not set or not built";
    if (!fs::exists(test::stories_dir())) GTEST_SKIP() << "no " << test::stories_dir();
    tmp_ = fs::temp_directory_path() / ("linnet_chat_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    if (!tmp_.empty()) fs::remove_all(tmp_);
  }

  CliResult run(const std::string& args) const { return test::run_direct(args, tmp_ / "stderr.txt"); }

  fs::path bin_, tmp_;
};

// Requests as transformers' apply_chat_template itself renders them (null-valued keys
// dropped, reasoning aliases, empty conversations refused): goldens from
// scripts/make_chat_request_fixtures.py.
TEST(ChatRequests, NormalizedAsTransformersDoes) {
  for (const ojson& row : read_jsonl(golden_dir() / "requests_transformers.jsonl")) {
    const auto dir = test::shared_dir() / "models" / "cards" / row["card"].get<std::string>();
    const Tokenizer tok = Tokenizer::from_dir(dir);
    const ModelChatTemplate chat = load_chat_template(tok, dir);
    const auto render = [&] { return chat.chat_template.render(chat_variables(row["request"], chat.special_tokens, "request")); };
    if (row.contains("error")) {
      EXPECT_THROW(render(), Error) << row["request"].dump();
    } else {
      EXPECT_EQ(render(), row["text"].get<std::string>()) << row["request"].dump();
    }
  }
}

// The golden variables, given as request lines, come out as Jinja2's text.
TEST_F(ChatCli, TemplateSubcommandMatchesJinja2) {
  const fs::path card = test::shared_dir() / "models" / "cards" / "qwen3-4b";
  if (!fs::exists(card)) GTEST_SKIP() << "no " << card;
  std::string input;
  std::vector<std::string> expected;
  for (const ojson& row : read_jsonl(golden_dir() / "qwen3.jsonl")) {
    if (row.contains("error")) continue;
    input += row["variables"].dump() + "\n";
    expected.push_back(nlohmann::json{{"text", row["text"]}}.dump() + "\n");
  }
  std::ofstream(tmp_ / "in.jsonl") << input;
  const CliResult r = run("template --model " + quote(card.string()) + " --input " +
                          quote((tmp_ / "in.jsonl").string()));
  ASSERT_EQ(r.code, 0) << r.err;
  std::string all;
  for (const auto& e : expected) all += e;
  EXPECT_EQ(r.out, all);
}

// Acceptance 3: a model without a chat template is refused, naming tokenizer_config.json.
TEST_F(ChatCli, GenerateChatRefusesModelWithoutTemplate) {
  const std::string model = quote(test::stories_dir().string());
  const CliResult r = run("generate --model " + model + " --chat --prompt 'Once upon a time' --max-new-tokens 4");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("tokenizer_config.json"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no chat template"), std::string::npos) << r.err;
  std::ofstream(tmp_ / "in.jsonl") << R"({"messages": [{"role": "user", "content": "Hi"}]})" << "\n";
  // In --input the "messages" line fails alone (exit 3), its error naming the file.
  const CliResult t = run("--model " + model + " --input " + quote((tmp_ / "in.jsonl").string()));
  EXPECT_EQ(t.code, 3);
  EXPECT_NE(t.err.find("tokenizer_config.json"), std::string::npos) << t.err;
}

// With a template that writes the BOS text itself, the chat prompt's ids equal the raw
// prompt's ids with the tokenizer's BOS: one BOS, not two.
TEST_F(ChatCli, GenerateChatDoesNotAddASecondBos) {
  const fs::path model = tmp_ / "model";
  fs::create_directories(model);
  for (const auto& entry : fs::directory_iterator(test::stories_dir())) {
    if (entry.path().filename() != "tokenizer_config.json") fs::create_symlink(entry.path(), model / entry.path().filename());
  }
  nlohmann::json config = test::read_json(test::stories_dir() / "tokenizer_config.json");
  config["chat_template"] = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}";
  std::ofstream(model / "tokenizer_config.json") << config.dump();
  const std::string common = "--model " + quote(model.string()) + " --max-new-tokens 4 --output ";
  const CliResult chat = run(common + quote((tmp_ / "chat.jsonl").string()) + " --chat --prompt 'Once upon a time'");
  ASSERT_EQ(chat.code, 0) << chat.err;
  const CliResult raw = run(common + quote((tmp_ / "raw.jsonl").string()) + " --prompt 'Once upon a time'");
  ASSERT_EQ(raw.code, 0) << raw.err;
  const nlohmann::json c = nlohmann::json::parse(read_file(tmp_ / "chat.jsonl"));
  const nlohmann::json w = nlohmann::json::parse(read_file(tmp_ / "raw.jsonl"));
  EXPECT_EQ(c["prompt"], "<s>Once upon a time");
  EXPECT_EQ(c["prompt_ids"], w["prompt_ids"]);
  ASSERT_GE(c["prompt_ids"].size(), 2u);
  EXPECT_NE(c["prompt_ids"][0], c["prompt_ids"][1]);
  EXPECT_EQ(c["completion_ids"], w["completion_ids"]);
  // Invalid UTF-8 in --prompt with --chat is named as --prompt's (the message goes
  // through JSON, whose library would report a type error naming nothing).
  const CliResult bad = run(common + quote((tmp_ / "bad.jsonl").string()) + " --chat --prompt \"$(printf 'a\\303(')\"");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("--prompt: invalid UTF-8 at byte offset 1"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.err.find("json.exception"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace linnet

