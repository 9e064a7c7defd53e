// Tokenizer tests: encode/decode against goldens from the Hugging Face `tokenizers`
// package (tests/data/stories260k/tokenizer_cases.json), the streaming detokenizer
// against one-shot decode, and malformed / unsupported tokenizer files.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <random>

#include "common/error.h"
#include "loader/tokenizer/tokenizer.h"
#include "tests/test_data.h"
#include "tests/test_helpers.h"

namespace linnet {
namespace {

using linnet::test::error_of;
using linnet::test::valid_utf8;

namespace fs = std::filesystem;
using nlohmann::json;

const Tokenizer& stories() {
  static const Tokenizer tok = Tokenizer::from_dir(test::stories_dir());
  return tok;
}

json golden_cases() {
  return test::read_json(test::test_data_dir() / "stories260k" / "tokenizer_cases.json")
      .at("cases");
}

/// A scratch directory for hand-made tokenizer files, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("linnet_tok_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return path_ / name;
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

json stories_json() { return test::read_json(test::stories_dir() / "tokenizer.json"); }

struct Streamed {
  std::string text;
  std::vector<std::string> chunks;
};

Streamed stream(const Tokenizer& tok, const std::vector<int32_t>& prompt,
                const std::vector<int32_t>& generated) {
  StreamingDetokenizer detok(tok, prompt);
  Streamed s;
  for (const int32_t id : generated) s.chunks.push_back(detok.push(id));
  s.chunks.push_back(detok.flush());
  for (const auto& c : s.chunks) s.text += c;
  return s;
}

/// Streams ids[split:] after the prompt ids[:split] and checks the result against
/// decode(ids) minus decode(ids[:split]) whenever the latter is a prefix.
void expect_stream_matches(const Tokenizer& tok, const std::vector<int32_t>& ids, std::size_t split) {
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + split);
  const std::vector<int32_t> generated(ids.begin() + split, ids.end());
  const std::string full = tok.decode(ids);
  const std::string head = tok.decode(prompt);
  const Streamed s = stream(tok, prompt, generated);
  for (const auto& chunk : s.chunks) EXPECT_TRUE(valid_utf8(chunk)) << "chunk not UTF-8";
  if (full.compare(0, head.size(), head) != 0) return;  // prompt text changed by new ids
  EXPECT_EQ(s.text, full.substr(head.size())) << "split " << split << " of " << ids.size();
}

TEST(Tokenizer, StoriesBasics) {
  const Tokenizer& tok = stories();
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.bos_token_id(), 1);
  EXPECT_EQ(tok.eos_token_id(), 2);
  EXPECT_EQ(tok.token_to_id("<s>"), 1);
  EXPECT_EQ(tok.token_to_id("<0x0A>"), 13);
  EXPECT_EQ(tok.token_to_id("no such token"), std::nullopt);
  EXPECT_EQ(tok.id_to_token(2), "</s>");
  EXPECT_EQ(tok.id_to_token(tok.token_to_id("▁the").value()), "▁the");
  EXPECT_TRUE(tok.is_special(0) && tok.is_special(1) && tok.is_special(2));
  EXPECT_FALSE(tok.is_special(3) || tok.is_special(-1) || tok.is_special(512));
  EXPECT_EQ(tok.chat_template(), "");
  EXPECT_NE(error_of([&] { tok.id_to_token(512); }).find("512"), std::string::npos);
  EXPECT_NE(error_of([&] { tok.id_to_token(-1); }).find("-1"), std::string::npos);
}

TEST(Tokenizer, GoldenCasesFromHuggingFaceTokenizers) {
  const Tokenizer& tok = stories();
  const json cases = golden_cases();
  ASSERT_GT(cases.size(), 10u);
  for (const json& c : cases) {
    const std::string text = c.at("text");
    SCOPED_TRACE("text: \"" + text + "\"");
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), ids);
    EXPECT_EQ(tok.encode(text, /*add_special_tokens=*/false),
              c.at("ids_no_special").get<std::vector<int32_t>>());
    EXPECT_EQ(tok.decode(ids), c.at("decoded").get<std::string>());
  }
}

TEST(Tokenizer, DecodeKeepsSpecialTokensWhenAsked) {
  const Tokenizer& tok = stories();
  const std::vector<int32_t> ids = tok.encode("<s>hello</s>");
  EXPECT_EQ(tok.decode(ids), "hello");
  // "<s>" then "▁he": Strip removes only a space at the very start.
  EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/false), "<s><s> hello</s>");
}

TEST(Tokenizer, ByteFallbackRunsDecodeAsOneUnit) {
  const Tokenizer& tok = stories();
  const int32_t e4 = tok.token_to_id("<0xE4>").value();
  const int32_t b8 = tok.token_to_id("<0xB8>").value();
  const int32_t ad = tok.token_to_id("<0xAD>").value();
  const int32_t x80 = tok.token_to_id("<0x80>").value();
  const int32_t s = tok.token_to_id("<s>").value();
  EXPECT_EQ(tok.decode(std::vector<int32_t>{e4, b8, ad}), "中");
  // Special tokens are removed before the decoder, so they do not split the run.
  EXPECT_EQ(tok.decode(std::vector<int32_t>{e4, s, b8, ad}), "中");
  // An invalid run becomes one U+FFFD per byte, the valid "中" included.
  EXPECT_EQ(tok.decode(std::vector<int32_t>{e4, b8, ad, x80}), "\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{e4, b8}), "\uFFFD\uFFFD");
}

TEST(Tokenizer, DecodeRejectsUnknownIds) {
  const Tokenizer& tok = stories();
  const std::string msg = error_of([&] { tok.decode(std::vector<int32_t>{5, 600}); });
  EXPECT_NE(msg.find("600"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { tok.decode(std::vector<int32_t>{-3}); }).find("-3"), std::string::npos);
}

TEST(Tokenizer, FromJsonTextEqualsFromFilesAndNamesItsSources) {
  const auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const std::string tokenizer = read(test::stories_dir() / "tokenizer.json");
  const std::string config = read(test::stories_dir() / "tokenizer_config.json");
  const Tokenizer tok = Tokenizer::from_json_text(tokenizer, config);
  for (const json& c : golden_cases()) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(tok.encode(text), stories().encode(text)) << text;
  }
  EXPECT_EQ(tok.bos_token_id(), 1);
  EXPECT_EQ(tok.eos_token_id(), 2);
  // Without a config: no EOS; errors name the sources given.
  EXPECT_EQ(Tokenizer::from_json_text(tokenizer, std::nullopt).eos_token_id(), std::nullopt);
  EXPECT_NE(error_of([&] { Tokenizer::from_json_text("{", std::nullopt, "mem/tokenizer.json"); })
                .find("mem/tokenizer.json: malformed JSON"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Tokenizer::from_json_text(tokenizer, "[]", "t", "mem/config.json"); })
                .find("mem/config.json: top level is not a JSON object"),
            std::string::npos);
}

TEST(Tokenizer, InvalidUtf8IsAnErrorWithItsOffset) {
  const Tokenizer& tok = stories();
  const std::pair<std::string, std::size_t> bad[] = {
      {"ab\xFF" "cd", 2},          // never valid
      {"abc\xE4\xB8", 3},          // truncated at the end
      {"\xC0\x80", 0},             // overlong NUL
      {"ok \xED\xA0\x80", 3},      // UTF-16 surrogate
      {"x\xF4\x90\x80\x80", 1},    // > U+10FFFF
      {"\xE4\xB8\xAD\x80", 3},     // stray continuation byte after a valid char
  };
  for (const auto& [text, offset] : bad) {
    const std::string msg = error_of([&] { tok.encode(text); });
    EXPECT_NE(msg.find("invalid UTF-8 at byte offset " + std::to_string(offset)), std::string::npos)
        << "got: " << msg;
  }
}

TEST(Tokenizer, StreamingEqualsOneShotDecodeOnGoldenCases) {
  const Tokenizer& tok = stories();
  for (const json& c : golden_cases()) {
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    SCOPED_TRACE("text: \"" + c.at("text").get<std::string>() + "\"");
    for (std::size_t split = 0; split <= ids.size(); ++split) expect_stream_matches(tok, ids, split);
    // Generation from a BOS-only prompt: no U+FFFD ever shows up for valid text.
    const Streamed s = stream(tok, {1}, std::vector<int32_t>(ids.begin() + 1, ids.end()));
    EXPECT_EQ(s.text, c.at("decoded").get<std::string>());
    for (const auto& chunk : s.chunks) EXPECT_EQ(chunk.find("\uFFFD"), std::string::npos);
  }
}

// A run of "▁" tokens: one alone at the start of a decode is stripped to nothing, so the
// window could never restart at the last id and grew with the run; every push re-decoded
// it (40000 ids: minutes). It restarts a few ids back now, where the text is not empty.
TEST(Tokenizer, StreamingARunOfSpaceTokensTakesLinearTime) {
  const Tokenizer& tok = stories();
  const int32_t space = tok.token_to_id("\u2581").value();
  const int32_t once = tok.token_to_id("\u2581Once").value();
  for (const std::vector<int32_t>& prompt : {std::vector<int32_t>{}, std::vector<int32_t>{1},
                                             std::vector<int32_t>{1, once}, std::vector<int32_t>{1, space}}) {
    std::vector<int32_t> ids = prompt;
    for (int k = 0; k < 40000; ++k) ids.push_back(k % 20000 == 19999 ? once : space);
    const auto start = std::chrono::steady_clock::now();
    StreamingDetokenizer detok(tok, prompt);
    std::string text;
    for (std::size_t k = prompt.size(); k < ids.size(); ++k) text += detok.push(ids[k]);
    text += detok.flush();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 3.0);
    EXPECT_EQ(text, tok.decode(ids).substr(tok.decode(prompt).size()));
  }
}

TEST(Tokenizer, StreamingHoldsSplitCharacters) {
  const Tokenizer& tok = stories();
  const std::vector<int32_t> ids = tok.encode("a 😀 b", false);  // the emoji is 4 byte tokens
  StreamingDetokenizer detok(tok, {1});
  std::string text;
  for (const int32_t id : ids) {
    const std::string chunk = detok.push(id);
    EXPECT_TRUE(valid_utf8(chunk));
    EXPECT_EQ(chunk.find("\uFFFD"), std::string::npos);
    text += chunk;
  }
  text += detok.flush();
  EXPECT_EQ(text, "a 😀 b");
}

TEST(Tokenizer, StreamingEqualsOneShotDecodeOnRandomIds) {
  const Tokenizer& tok = stories();
  std::mt19937 rng(1234);
  const int32_t first_byte = tok.token_to_id("<0x00>").value();
  std::uniform_int_distribution<int32_t> any_id(0, static_cast<int32_t>(tok.vocab_size() - 1));
  std::uniform_int_distribution<int32_t> byte_id(first_byte, first_byte + 255);
  std::uniform_int_distribution<int> pick(0, 9);
  const std::string samples[] = {"中", "é", "😀", "日本語", "ü", " ", "\n"};
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<int32_t> ids;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) {
      const int r = pick(rng);
      if (r < 4) {
        ids.push_back(any_id(rng));
      } else if (r < 7) {
        ids.push_back(byte_id(rng));
      } else {  // the byte tokens of a valid multi-byte character
        const std::string& ch = samples[rng() % std::size(samples)];
        for (const char b : ch) ids.push_back(first_byte + static_cast<unsigned char>(b));
      }
    }
    for (std::size_t split = 0; split <= ids.size(); split += 1 + rng() % 4) {
      expect_stream_matches(tok, ids, split);
    }
  }
}

TEST(Tokenizer, StreamingValidTextNeverShowsReplacementCharacters) {
  const Tokenizer& tok = stories();
  std::mt19937 rng(99);
  const std::string pieces[] = {"the ", "dog", "中文", "ü", "😀", " ", "\n", "é", "Lily ", "!"};
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    for (int k = 0; k < 12; ++k) text += pieces[rng() % std::size(pieces)];
    const std::vector<int32_t> ids = tok.encode(text);
    const Streamed s = stream(tok, {ids[0]}, std::vector<int32_t>(ids.begin() + 1, ids.end()));
    EXPECT_EQ(s.text, text);
    for (const auto& chunk : s.chunks) EXPECT_EQ(chunk.find("\uFFFD"), std::string::npos);
  }
}

TEST(Tokenizer, MergesAsPairsEqualMergesAsStrings) {
  json j = stories_json();
  json pairs = json::array();
  for (const json& m : j["model"]["merges"]) {
    const std::string s = m.is_string() ? m.get<std::string>() : "";
    const auto space = s.find(' ');
    pairs.push_back(m.is_string() ? json::array({s.substr(0, space), s.substr(space + 1)}) : m);
  }
  j["model"]["merges"] = pairs;
  TempDir dir;
  const Tokenizer tok = Tokenizer::from_files(dir.write("tokenizer.json", j.dump()), dir.path() / "none.json");
  for (const json& c : golden_cases()) {
    EXPECT_EQ(tok.encode(c.at("text").get<std::string>()), c.at("ids").get<std::vector<int32_t>>());
  }
  // Without a config: BOS from the template, no EOS, no chat template.
  EXPECT_EQ(tok.bos_token_id(), 1);
  EXPECT_EQ(tok.eos_token_id(), std::nullopt);
}

TEST(Tokenizer, ConfigControlsBosAndChatTemplate) {
  TempDir dir;
  dir.write("tokenizer.json", stories_json().dump());
  dir.write("tokenizer_config.json", R"({"add_bos_token": false, "add_eos_token": true,
      "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
      "chat_template": "{{ messages }}"})");
  const Tokenizer tok = Tokenizer::from_dir(dir.path());
  const std::vector<int32_t> ids = tok.encode("Once upon a time");
  ASSERT_FALSE(ids.empty());
  EXPECT_NE(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(tok.encode("Once upon a time", false).size() + 1, ids.size());
  EXPECT_EQ(tok.bos_token_id(), 1);
  EXPECT_EQ(tok.chat_template(), "{{ messages }}");

  dir.write("tokenizer_config.json", R"({"eos_token": "<nope>"})");
  const std::string msg = error_of([&] { Tokenizer::from_dir(dir.path()); });
  EXPECT_NE(msg.find("<nope>"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tokenizer_config.json"), std::string::npos) << msg;
}

TEST(Tokenizer, AddedTokenStripFlagsAbsorbSpaces) {
  json j = stories_json();
  j["added_tokens"].push_back({{"id", 512}, {"content", "<mask>"}, {"single_word", false},
                               {"lstrip", true}, {"rstrip", true}, {"normalized", false},
                               {"special", false}});
  TempDir dir;
  const Tokenizer tok = Tokenizer::from_files(dir.write("t.json", j.dump()), dir.path() / "no.json");
  EXPECT_EQ(tok.vocab_size(), 513);
  EXPECT_FALSE(tok.is_special(512));
  // The spaces around <mask> belong to it, so "a" and "b" are encoded as if alone.
  const std::vector<int32_t> a = tok.encode("a", false);
  const std::vector<int32_t> b = tok.encode("b", false);
  std::vector<int32_t> expected = a;
  expected.push_back(512);
  expected.insert(expected.end(), b.begin(), b.end());
  EXPECT_EQ(tok.encode("a  <mask>  b", false), expected);
  // Not special, so decode keeps it even when skipping special tokens.
  EXPECT_EQ(tok.decode(expected), "a<mask> b");
}

TEST(Tokenizer, UnsupportedComponentNamesTypeAndFile) {
  const std::pair<std::string, std::string> cases[] = {
      {"/normalizer", "BertNormalizer"}, {"/pre_tokenizer", "Whitespace"},
      {"/decoder", "WordPiece"},         {"/post_processor", "RobertaProcessing"},
      {"/model/type", "Unigram"},
  };
  for (const auto& [pointer, type] : cases) {
    json j = stories_json();
    if (pointer == "/model/type") {
      j["model"]["type"] = type;
    } else {
      j[json::json_pointer(pointer)] = {{"type", type}};
    }
    TempDir dir;
    const fs::path file = dir.write("tokenizer.json", j.dump());
    const std::string msg = error_of([&] { Tokenizer::from_files(file, dir.path() / "no.json"); });
    EXPECT_NE(msg.find("'" + type + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
  }
}

TEST(Tokenizer, MalformedFilesNameTheFile) {
  TempDir dir;
  const std::string good = stories_json().dump();
  const std::string bad_texts[] = {
      good.substr(0, good.size() / 2),                                       // truncated
      "[1, 2, 3]",                                                           // not an object
      R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})",    // id not a number
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})",  // merge not in vocab
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}})",    // merge without space
      R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"content": "x"}]})",
      R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "decoder": {"type": "Strip", "content": 5}})",
  };
  for (const std::string& text : bad_texts) {
    const fs::path file = dir.write("tokenizer.json", text);
    const std::string msg = error_of([&] { Tokenizer::from_files(file, dir.path() / "no.json"); });
    EXPECT_NE(msg.find(file.string()), std::string::npos) << "for " << text.substr(0, 80) << ": " << msg;
  }
  const std::string missing = error_of([&] { Tokenizer::from_dir(dir.path() / "nowhere"); });
  EXPECT_NE(missing.find("tokenizer.json"), std::string::npos) << missing;

  dir.write("tokenizer.json", good);
  const fs::path config = dir.write("tokenizer_config.json", "{\"bos_token\": ");
  const std::string msg = error_of([&] { Tokenizer::from_dir(dir.path()); });
  EXPECT_NE(msg.find(config.string()), std::string::npos) << msg;
}

/// `inner` wrapped in `levels` component Sequences of `type` ("decoder" -> "decoders").
std::string nested_sequence(const std::string& list_key, const std::string& inner, int levels) {
  std::string text;
  for (int i = 0; i < levels; ++i) text += R"({"type": "Sequence", ")" + list_key + R"(": [)";
  text += inner;
  for (int i = 0; i < levels; ++i) text += "]}";
  return text;
}

TEST(Tokenizer, DeeplyNestedJsonIsRefusedNotACrash) {
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": )";
  const std::string texts[] = {
      // Each used to overflow the stack: a recursive Sequence build, or a json copy.
      "{" + model + R"(["a b"]}, "decoder": )" +
          nested_sequence("decoders", R"({"type": "Fuse"})", 20000) + "}",
      "{" + model + R"(["a b"]}, "normalizer": )" +
          nested_sequence("normalizers", R"({"type": "NFC"})", 50000) + "}",
      "{" + model + "[\"a b\", " + std::string(200000, '[') + std::string(200000, ']') + "]}}",
      // Not needed by any real tokenizer (they nest about 5 deep).
      "{" + model + R"(["a b"]}, "pre_tokenizer": )" +
          nested_sequence("pretokenizers", R"({"type": "ByteLevel"})", 2500) + "}",
  };
  TempDir dir;
  for (const std::string& text : texts) {
    const fs::path file = dir.write("tokenizer.json", text);
    const std::string msg = error_of([&] { Tokenizer::from_files(file, dir.path() / "no.json"); });
    EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("nested too deeply"), std::string::npos) << msg;
  }
  // tokenizer_config.json is checked the same way.
  dir.write("tokenizer.json", stories_json().dump());
  const fs::path config = dir.write(
      "tokenizer_config.json",
      R"({"chat_template": )" + std::string(100000, '[') + std::string(100000, ']') + "}");
  const std::string msg = error_of([&] { Tokenizer::from_dir(dir.path()); });
  EXPECT_NE(msg.find(config.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("nested too deeply"), std::string::npos) << msg;
  // Shallow Sequences still load.
  const fs::path file = dir.write(
      "tokenizer.json", "{" + model + R"(["a b"]}, "decoder": )" +
                            nested_sequence("decoders", R"({"type": "Fuse"})", 20) + "}");
  const Tokenizer tok = Tokenizer::from_files(file, dir.path() / "no.json");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{0, 1, 2}, false), "abab");
}

TEST(Tokenizer, HugeTokenIdsAreRefusedByName) {
  // Each used to allocate tables of id + 1 entries (tens of GB) or overflow id + 1.
  const std::string ids[] = {"400000000", "2147483647", "16777216", "9223372036854775808",
                             "18446744073709551615", "-1"};
  TempDir dir;
  for (const std::string& id : ids) {
    const std::string texts[] = {
        R"({"model": {"type": "BPE", "vocab": {"a": 0, "huge": )" + id + "}}}",
        R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"id": )" + id +
            R"(, "content": "huge", "special": true}]})",
        R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "huge", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": {"huge": {"id": "huge", "ids": [)" + id + "]}}}}",
    };
    for (const std::string& text : texts) {
      const fs::path file = dir.write("tokenizer.json", text);
      const std::string msg = error_of([&] { Tokenizer::from_files(file, dir.path() / "no.json"); });
      EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
      EXPECT_NE(msg.find("\"huge\""), std::string::npos) << msg;
      EXPECT_NE(msg.find(id), std::string::npos) << msg;
      EXPECT_NE(msg.find("16777216"), std::string::npos) << msg;  // the limit
    }
  }
  const fs::path file = dir.write(
      "tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 262143}}})");
  EXPECT_EQ(Tokenizer::from_files(file, dir.path() / "no.json").vocab_size(), 262144);
}

TEST(Tokenizer, FilesThatAreNotRegularAreRefusedByName) {
  {
    TempDir dir;  // tokenizer.json a FIFO: open() used to block forever
    const fs::path file = dir.path() / "tokenizer.json";
    ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
    const std::string msg = error_of([&] { Tokenizer::from_dir(dir.path()); });
    EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
  }
  {
    TempDir dir;
    dir.write("tokenizer.json", stories_json().dump());
    const fs::path config = dir.path() / "tokenizer_config.json";
    fs::create_directory(config);
    std::string msg = error_of([&] { Tokenizer::from_dir(dir.path()); });
    EXPECT_NE(msg.find(config.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
    fs::remove(config);
    ASSERT_EQ(::mkfifo(config.c_str(), 0600), 0);
    msg = error_of([&] { Tokenizer::from_dir(dir.path()); });
    EXPECT_NE(msg.find(config.string()), std::string::npos) << msg;
    fs::remove(config);
    const fs::path jinja = dir.path() / "chat_template.jinja";
    ASSERT_EQ(::mkfifo(jinja.c_str(), 0600), 0);
    msg = error_of([&] { Tokenizer::from_dir(dir.path()); });
    EXPECT_NE(msg.find(jinja.string()), std::string::npos) << msg;
  }
}

TEST(Tokenizer, CopiesShareTablesAndCacheIsConsistent) {
  const Tokenizer copy = stories();
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const std::vector<int32_t> first = copy.encode(text);
  EXPECT_EQ(stories().encode(text), first);  // second call served from the word cache
  EXPECT_EQ(copy.decode(first), text);
}

}  // namespace
}  // namespace linnet
