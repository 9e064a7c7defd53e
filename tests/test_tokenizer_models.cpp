// Tokenizers of the seed models (Llama-3.1 and Qwen3 byte-level BPE, Phi-3
// SentencePiece-style BPE) against goldens from the Hugging Face `tokenizers` package
// (tests/data/tokenizers/*.json, made by scripts/make_tokenizer_fixtures.py): encode with
// and without special tokens, decode (lossy decoding of broken byte runs included),
// round trips where the tokenizer is lossless, the streaming detokenizer against
// one-shot decode, and the tokenizer_config.json fields.
#include <chrono>
#include <random>

#include "common/error.h"
#include "loader/tokenizer/tokenizer.h"
#include "tests/test_data.h"
#include "tests/test_helpers.h"

namespace linnet {
namespace {

using linnet::test::valid_utf8;

namespace fs = std::filesystem;
using nlohmann::json;

struct Model {
  std::string name;  // the golden file's stem
  json golden;
  Tokenizer tok;
};

const Model& model(const std::string& name) {
  static std::map<std::string, Model> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) {
    json golden = test::read_json(test::test_data_dir() / "tokenizers" / (name + ".json"));
    const fs::path dir = test::shared_dir() / golden.at("model_dir").get<std::string>();
    it = loaded.emplace(name, Model{name, golden, Tokenizer::from_dir(dir)}).first;
  }
  return it->second;
}

const char* const kModels[] = {"llama-3.1", "qwen3", "phi-3"};

/// Streams `generated` after `prompt`; returns every chunk (the last one from flush()).
std::vector<std::string> stream_chunks(const Tokenizer& tok, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& generated, bool skip_special) {
  StreamingDetokenizer detok(tok, prompt, skip_special);
  std::vector<std::string> chunks;
  for (const int32_t id : generated) chunks.push_back(detok.push(id));
  chunks.push_back(detok.flush());
  return chunks;
}

/// Streaming ids[split:] after ids[:split] gives decode(ids) minus decode(ids[:split])
/// (when the latter is a prefix of the former), in valid UTF-8 chunks.
void expect_stream_matches(const Tokenizer& tok, const std::vector<int32_t>& ids, std::size_t split,
                           bool skip_special) {
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(split));
  const std::vector<int32_t> generated(ids.begin() + static_cast<std::ptrdiff_t>(split), ids.end());
  const std::string full = tok.decode(ids, skip_special);
  const std::string head = tok.decode(prompt, skip_special);
  std::string text;
  for (const std::string& chunk : stream_chunks(tok, prompt, generated, skip_special)) {
    EXPECT_TRUE(valid_utf8(chunk)) << "chunk is not UTF-8";
    text += chunk;
  }
  if (full.compare(0, head.size(), head) != 0) return;  // the new ids change the prompt's text
  EXPECT_EQ(text, full.substr(head.size())) << "split " << split << " of " << ids.size();
}

TEST(TokenizerModels, EncodeMatchesHuggingFaceTokenizers) {
  for (const char* name : kModels) {
    const Model& m = model(name);
    const bool with_special = m.golden.at("with_special").get<bool>();
    int checked = 0;
    for (const json& c : m.golden.at("cases")) {
      const std::string text = c.at("text").get<std::string>();
      SCOPED_TRACE(std::string(name) + " text: \"" + text + "\"");
      EXPECT_EQ(m.tok.encode(text, false), c.at("ids").get<std::vector<int32_t>>());
      if (with_special) {
        EXPECT_EQ(m.tok.encode(text, true), c.at("ids_with_special").get<std::vector<int32_t>>());
      }
      ++checked;
    }
    EXPECT_GE(checked, 39) << name;
  }
}

TEST(TokenizerModels, DecodeMatchesHuggingFaceTokenizers) {
  for (const char* name : kModels) {
    const Model& m = model(name);
    for (const char* section : {"cases", "decode_cases"}) {
      for (const json& c : m.golden.at(section)) {
        const auto ids = c.at("ids").get<std::vector<int32_t>>();
        SCOPED_TRACE(std::string(name) + " " + section + " ids: " + json(ids).dump());
        EXPECT_EQ(m.tok.decode(ids, false), c.at("decoded").get<std::string>());
        EXPECT_EQ(m.tok.decode(ids, true), c.at("decoded_skip_special").get<std::string>());
      }
    }
  }
}

TEST(TokenizerModels, RoundTripWhereLossless) {
  // Lossless = `tokenizers` itself gives the text back; the cases where it does not are
  // NFC (Qwen3), whitespace absorbed by rstrip tokens and spaces around special tokens
  // (Phi-3).
  for (const char* name : kModels) {
    const Model& m = model(name);
    int lossless = 0;
    for (const json& c : m.golden.at("cases")) {
      const std::string text = c.at("text").get<std::string>();
      if (c.at("decoded").get<std::string>() != text) continue;
      EXPECT_EQ(m.tok.decode(m.tok.encode(text, false), false), text) << name;
      ++lossless;
    }
    EXPECT_GE(lossless, 25) << name;
  }
  // Byte-level BPE is lossless on any valid text, NFC-normal text for Qwen3.
  const std::string text = "  mixed 中文 and 🤗 emoji\n\t<|eot_id|> <|im_end|> \u00e9 \u0085 x ";
  for (const char* name : {"llama-3.1", "qwen3"}) {
    EXPECT_EQ(model(name).tok.decode(model(name).tok.encode(text, false), false), text) << name;
  }
}

TEST(TokenizerModels, StreamingEqualsOneShotDecode) {
  for (const char* name : kModels) {
    const Model& m = model(name);
    for (const char* section : {"cases", "decode_cases"}) {
      for (const json& c : m.golden.at(section)) {
        const auto ids = c.at("ids").get<std::vector<int32_t>>();
        SCOPED_TRACE(std::string(name) + " " + section + " ids: " + json(ids).dump());
        const std::size_t step = ids.size() > 40 ? ids.size() / 8 : 1;
        for (std::size_t split = 0; split <= ids.size(); split += step) {
          expect_stream_matches(m.tok, ids, split, true);
          expect_stream_matches(m.tok, ids, split, false);
        }
      }
    }
  }
}

TEST(TokenizerModels, StreamingEqualsOneShotDecodeOnRandomIds) {
  for (const char* name : kModels) {
    const Tokenizer& tok = model(name).tok;
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> any_id(0, static_cast<int32_t>(tok.vocab_size() - 1));
    // Single-byte tokens: the first 256 ids of the byte-level vocabularies; Phi-3's <0xXX>.
    const int32_t first_byte = std::string(name) == "phi-3" ? tok.token_to_id("<0x00>").value() : 0;
    for (int trial = 0; trial < 150; ++trial) {
      std::vector<int32_t> ids;
      const int n = 1 + static_cast<int>(rng() % 30);
      for (int k = 0; k < n; ++k) {
        ids.push_back(rng() % 2 ? any_id(rng) : first_byte + static_cast<int32_t>(rng() % 256));
      }
      for (std::size_t split = 0; split <= ids.size(); split += 1 + rng() % 5) {
        expect_stream_matches(tok, ids, split, trial % 2 == 0);
      }
    }
  }
}

TEST(TokenizerModels, StreamingNeverShowsSplitCharacters) {
  const std::string text = "Grüße 中文 🤗👨\u200d👩\u200d👧 done";
  for (const char* name : kModels) {
    const Tokenizer& tok = model(name).tok;
    const std::vector<int32_t> ids = tok.encode(text, false);
    // Prompt: one token; then the rest one id at a time.
    const auto chunks = stream_chunks(tok, {ids[0]}, std::vector<int32_t>(ids.begin() + 1, ids.end()), true);
    std::string streamed = tok.decode(std::vector<int32_t>{ids[0]});
    for (const std::string& chunk : chunks) {
      EXPECT_TRUE(valid_utf8(chunk)) << name;
      EXPECT_EQ(chunk.find("\uFFFD"), std::string::npos) << name;
      streamed += chunk;
    }
    EXPECT_EQ(streamed, text) << name;
  }
}

TEST(TokenizerModels, StreamingInvalidBytesTakesLinearTime) {
  // Byte-level tokens of lone continuation bytes (0x80 is "\u0122" in GPT-2's byte
  // map) decode to U+FFFD each, forever, and an unfinished lead byte (0xE2, "\u00e2") at
  // the end. The stream holds text while it ends in U+FFFD, but must not re-decode the
  // whole held run at every push: 30000 such ids took minutes when it did.
  for (const char* name : {"llama-3.1", "qwen3"}) {
    const Tokenizer& tok = model(name).tok;
    const int32_t cont = tok.token_to_id("\u0122").value();
    const int32_t lead = tok.token_to_id("\u00e2").value();
    std::vector<int32_t> ids = tok.encode("Hello", false);
    const std::size_t split = ids.size();
    for (int k = 0; k < 30000; ++k) ids.push_back(cont);
    ids.push_back(lead);
    const auto start = std::chrono::steady_clock::now();
    std::string text;
    for (const std::string& chunk : stream_chunks(tok, std::vector<int32_t>(ids.begin(), ids.begin() + split),
                                                  std::vector<int32_t>(ids.begin() + split, ids.end()), true)) {
      EXPECT_TRUE(valid_utf8(chunk)) << name;
      text += chunk;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(text, tok.decode(ids).substr(tok.decode(std::vector<int32_t>(ids.begin(), ids.begin() + split)).size()))
        << name;
    EXPECT_LT(seconds, 3.0) << name << ": streaming 30000 invalid bytes";
  }
}

TEST(TokenizerModels, InvalidUtf8IsAnErrorWithItsOffset) {
  for (const char* name : kModels) {
    try {
      model(name).tok.encode("ok \xE4\xB8 bad", false);
      ADD_FAILURE() << name << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("invalid UTF-8 at byte offset 3"), std::string::npos)
          << e.what();
    }
  }
}

TEST(TokenizerModels, ConfigTokens) {
  const Tokenizer& llama = model("llama-3.1").tok;
  EXPECT_EQ(llama.bos_token_id(), 128000);
  EXPECT_EQ(llama.eos_token_id(), 128009);  // <|eot_id|>
  EXPECT_EQ(llama.vocab_size(), 128256);
  EXPECT_TRUE(llama.is_special(128009));
  const Tokenizer& qwen = model("qwen3").tok;
  EXPECT_EQ(qwen.bos_token_id(), std::nullopt);
  EXPECT_EQ(qwen.eos_token_id(), 151645);  // <|im_end|>
  EXPECT_EQ(qwen.pad_token_id(), 151643);  // <|endoftext|>
  EXPECT_EQ(qwen.encode("hi", true), qwen.encode("hi", false));
  EXPECT_FALSE(qwen.chat_template().empty());
  const Tokenizer& phi = model("phi-3").tok;
  EXPECT_EQ(phi.bos_token_id(), 1);
  EXPECT_EQ(phi.eos_token_id(), 32000);  // <|endoftext|>
  EXPECT_EQ(phi.pad_token_id(), 32000);
  // add_bos_token in tokenizer_config.json: BOS in front, as transformers does.
  std::vector<int32_t> with_bos{1};
  for (const int32_t id : phi.encode("Hello", false)) with_bos.push_back(id);
  EXPECT_EQ(phi.encode("Hello", true), with_bos);
  EXPECT_FALSE(phi.chat_template().empty());
}

}  // namespace
}  // namespace linnet
