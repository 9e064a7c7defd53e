// Tokenizer components the seed models do not all use (Metaspace, ByteLevel with a
// prefix space, every Split behavior, NFKC, added tokens with lstrip / single_word /
// normalized), on small tokenizers trained with the Hugging Face `tokenizers` whose ids
// it also recorded (tests/data/tokenizers/synthetic.json); the Split regex engine
// (PCRE2 with Oniguruma's \s); and malformed pre-tokenizer sections.
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "common/error.h"
#include "loader/tokenizer/tokenizer.h"
#include "loader/tokenizer/tokenizer_regex.h"
#include "tests/test_data.h"
#include "tests/test_helpers.h"

namespace linnet {
namespace {

using linnet::test::error_of;

namespace fs = std::filesystem;
using nlohmann::json;

/// Writes `j` to a scratch tokenizer.json and loads it (no tokenizer_config.json).
Tokenizer load_json(const json& j) {
  static int counter = 0;
  const fs::path dir = fs::temp_directory_path() /
                       ("linnet_tokc_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json", std::ios::binary) << j.dump();
  struct Cleanup {
    fs::path p;
    ~Cleanup() { fs::remove_all(p); }
  } cleanup{dir};
  return Tokenizer::from_files(dir / "tokenizer.json", dir / "none.json");
}

TEST(TokenizerComponents, SyntheticTokenizersMatchHuggingFace) {
  const json doc = test::read_json(test::test_data_dir() / "tokenizers" / "synthetic.json");
  int tokenizers = 0;
  for (const json& t : doc.at("tokenizers")) {
    const std::string name = t.at("name").get<std::string>();
    const Tokenizer tok = load_json(t.at("tokenizer"));
    for (const json& c : t.at("cases")) {
      const std::string text = c.at("text").get<std::string>();
      SCOPED_TRACE(name + " text: \"" + text + "\"");
      const auto ids = c.at("ids").get<std::vector<int32_t>>();
      EXPECT_EQ(tok.encode(text, false), ids);
      EXPECT_EQ(tok.decode(ids, false), c.at("decoded").get<std::string>());
      // Streaming decode of the whole sequence equals the one-shot decode.
      StreamingDetokenizer detok(tok, {}, false);
      std::string streamed;
      for (const int32_t id : ids) streamed += detok.push(id);
      streamed += detok.flush();
      EXPECT_EQ(streamed, tok.decode(ids, false));
    }
    ++tokenizers;
  }
  EXPECT_EQ(tokenizers, 16);
}

std::vector<std::pair<std::size_t, std::size_t>> matches(const std::string& pattern, const std::string& text) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  tok::Regex(pattern, "test").find_all(text, out);
  return out;
}

// A byte-level token whose bytes end inside a character that the next token finishes
// ("\u013e\u00ac\u00e8" is 9C AC E8: two continuation bytes and a lead byte): repeated,
// no token boundary is a character boundary, so no decode window could restart and every
// push re-decoded all of them (40000 ids: about 30 s). The byte-level stream is linear.
TEST(TokenizerComponents, StreamingCharactersSplitAtEveryTokenTakesLinearTime) {
  const json doc = test::read_json(test::test_data_dir() / "tokenizers" / "synthetic.json");
  for (const json& t : doc.at("tokenizers")) {
    if (t.at("name") != "bytelevel_added_tokens") continue;
    const Tokenizer tok = load_json(t.at("tokenizer"));
    const int32_t split = tok.token_to_id("\u013e\u00ac\u00e8").value();
    for (const int prompt_len : {0, 1, 2}) {
      SCOPED_TRACE(prompt_len);
      std::vector<int32_t> ids(40000, split);
      const std::vector<int32_t> prompt(ids.begin(), ids.begin() + prompt_len);
      const auto start = std::chrono::steady_clock::now();
      StreamingDetokenizer detok(tok, prompt, false);
      std::string streamed;
      for (std::size_t k = prompt.size(); k < ids.size(); ++k) streamed += detok.push(ids[k]);
      streamed += detok.flush();
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 3.0);
      const std::string all = tok.decode(ids, false);
      const std::string head = tok.decode(prompt, false);
      // The prompt's last lead byte shows as U+FFFD alone and becomes a character after.
      const std::size_t common = all.compare(0, head.size(), head) == 0 ? head.size() : head.size() - 3;
      EXPECT_EQ(streamed, all.substr(common));
    }
    return;
  }
  FAIL() << "no bytelevel_added_tokens in synthetic.json";
}

TEST(TokenizerComponents, RegexSpaceIsUnicodeWhiteSpaceAsInOniguruma) {
  using M = std::vector<std::pair<std::size_t, std::size_t>>;
  EXPECT_EQ(matches("\\s", "\u0085"), (M{{0, 2}}));    // NEL is White_Space
  EXPECT_EQ(matches("\\s", "\u180E"), M{});            // U+180E is not (PCRE2's \s has it)
  EXPECT_EQ(matches("\\s+", "\t\u3000\u2028 "), (M{{0, 8}}));
  EXPECT_EQ(matches("[^\\s\\p{L}]+", "ab\u180E\u180E c"), (M{{2, 8}}));
  EXPECT_EQ(matches("\\S+", "a\u00A0b"), (M{{0, 1}, {3, 4}}));
  EXPECT_EQ(matches("\\w+", "e\u0301x_1 !"), (M{{0, 6}}));  // marks are word characters
  EXPECT_EQ(matches("(?i:'s)", "'S 's"), (M{{0, 2}, {3, 5}}));
  EXPECT_EQ(matches("\\p{N}{1,3}", "12345"), (M{{0, 3}, {3, 5}}));
  EXPECT_EQ(matches("\\s+(?!\\S)", "a   b"), (M{{1, 3}}));
  EXPECT_EQ(tok::Regex::to_pcre2("[]\\s]", "t"), "[]\\t-\\r\\x{85}\\p{Z}]");
}

TEST(TokenizerComponents, RegexEmptyMatchesFollowOniguruma) {
  using M = std::vector<std::pair<std::size_t, std::size_t>>;
  // An empty match right after the previous match is skipped; others are reported.
  EXPECT_EQ(matches("a*", "baab"), (M{{0, 0}, {1, 3}, {4, 4}}));
  EXPECT_EQ(matches("x*", "\u00e9"), (M{{0, 0}, {2, 2}}));
}

TEST(TokenizerComponents, MalformedPreTokenizerNamesTheProblem) {
  const json base = test::read_json(test::stories_dir() / "tokenizer.json");
  struct Case {
    json pre_tokenizer;
    std::string expected;
  };
  const Case cases[] = {
      {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
       "does not compile"},
      {{{"type", "Split"}, {"pattern", {{"Regex", "[\\S]"}}}, {"behavior", "Isolated"}},
       "inside a character class"},
      {{{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}}, "'Sideways'"},
      {{{"type", "Split"}, {"pattern", 7}, {"behavior", "Isolated"}}, "malformed Split pattern"},
      {{{"type", "Metaspace"}, {"replacement", "ab"}}, "one character"},
      {{{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}}, "'sometimes'"},
      {{{"type", "ByteLevel"}, {"add_prefix_space", "yes"}}, "'add_prefix_space' is not a boolean"},
      {{{"type", "Sequence"}, {"pretokenizers", 3}}, "'pretokenizers' array"},
      {{{"type", "Digits"}}, "unsupported pre_tokenizer type 'Digits'"},
  };
  for (const Case& c : cases) {
    json j = base;
    j["pre_tokenizer"] = c.pre_tokenizer;
    const std::string msg = error_of([&] { load_json(j); });
    EXPECT_NE(msg.find(c.expected), std::string::npos) << c.pre_tokenizer.dump() << " -> " << msg;
    EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
  }
  json j = base;
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(error_of([&] { load_json(j); }).find("'Lowercase'"), std::string::npos);
  j = base;
  j["post_processor"] = {{"type", "Sequence"}, {"processors", {{{"type", "BertProcessing"}}}}};
  EXPECT_NE(error_of([&] { load_json(j); }).find("'BertProcessing'"), std::string::npos);
}

TEST(TokenizerComponents, DeeplyNestedSequenceIsAnErrorNotACrash) {
  json j = test::read_json(test::stories_dir() / "tokenizer.json");
  json pre = {{"type", "Digits"}};
  for (int i = 0; i < 20; ++i) pre = {{"type", "Sequence"}, {"pretokenizers", json::array({pre})}};
  j["pre_tokenizer"] = pre;
  EXPECT_NE(error_of([&] { load_json(j); }).find("'Digits'"), std::string::npos);
  // Deeper than the tokenizer's JSON depth limit: refused before any Sequence is built.
  for (int i = 20; i < 200; ++i) pre = {{"type", "Sequence"}, {"pretokenizers", json::array({pre})}};
  j["pre_tokenizer"] = pre;
  EXPECT_NE(error_of([&] { load_json(j); }).find("nested too deeply"), std::string::npos);
}

}  // namespace
}  // namespace linnet
