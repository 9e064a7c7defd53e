// llama.cpp's tokenizer vectors (../shared/tokenizer-tests, made with the Hugging Face
// tokenizers): every text of X.inp must encode, without special tokens, to the ids on
// the matching line of X.out. X.inp holds the texts each followed by the line
// "__ggml_vocab_test__" (so texts are separated by "\n__ggml_vocab_test__\n", and the
// piece after the last separator is empty), as llama.cpp's test-tokenizer-0 reads it.
#include <sstream>

#include "loader/tokenizer/tokenizer.h"
#include "tests/test_data.h"

namespace linnet {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> read_texts(const fs::path& p) {
  const std::string all = read_all(p);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  std::size_t pos = 0;
  for (std::size_t hit; (hit = all.find(sep, pos)) != std::string::npos; pos = hit + sep.size()) {
    texts.push_back(all.substr(pos, hit - pos));
  }
  EXPECT_EQ(pos, all.size()) << p << " does not end with the separator";
  return texts;
}

std::vector<std::vector<int32_t>> read_ids(const fs::path& p) {
  std::istringstream in(read_all(p));
  std::vector<std::vector<int32_t>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<int32_t> ids;
    for (int32_t id; words >> id;) ids.push_back(id);
    out.push_back(std::move(ids));
  }
  return out;
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

/// Runs vector set `name` against the tokenizer of model card `card`; returns the
/// number of texts that gave exactly the expected ids.
int check_vectors(const std::string& name, const std::string& card) {
  const fs::path dir = test::shared_dir() / "tokenizer-tests";
  const std::vector<std::string> texts = read_texts(dir / (name + ".inp"));
  const std::vector<std::vector<int32_t>> expected = read_ids(dir / (name + ".out"));
  EXPECT_EQ(texts.size(), 46u);
  EXPECT_EQ(texts.size(), expected.size());
  const Tokenizer tok = Tokenizer::from_dir(test::shared_dir() / "models" / "cards" / card);
  int passed = 0;
  for (std::size_t i = 0; i < texts.size() && i < expected.size(); ++i) {
    const std::vector<int32_t> ids = tok.encode(texts[i], /*add_special_tokens=*/false);
    EXPECT_EQ(ids, expected[i]) << name << " text " << i << ": \"" << texts[i] << "\"\n got:     "
                                << ids_text(ids) << "\n expected:" << ids_text(expected[i]);
    passed += ids == expected[i] ? 1 : 0;
  }
  return passed;
}

// Tokenizer::token_bytes: the bytes each id of llama.cpp's expected ids stands for, put
// end to end, are the text (for the texts whose decode gives them back), also where a
// character's bytes are split over several byte tokens; SentencePiece's dummy prefix
// space is the one byte more at the front.
int check_token_bytes(const std::string& name, const std::string& card, bool dummy_prefix) {
  const fs::path dir = test::shared_dir() / "tokenizer-tests";
  const std::vector<std::string> texts = read_texts(dir / (name + ".inp"));
  const std::vector<std::vector<int32_t>> expected = read_ids(dir / (name + ".out"));
  const Tokenizer tok = Tokenizer::from_dir(test::shared_dir() / "models" / "cards" / card);
  int checked = 0;
  for (std::size_t i = 0; i < texts.size() && i < expected.size(); ++i) {
    if (expected[i].empty() || tok.decode(expected[i], false) != texts[i]) continue;
    std::string joined;
    for (const int32_t id : expected[i]) joined += tok.token_bytes(id);
    const std::string want = (dummy_prefix ? " " : "") + texts[i];
    EXPECT_EQ(joined, want) << name << " text " << i;
    ++checked;
  }
  return checked;
}

TEST(TokenizerVectors, TokenBytesJoinToTheText) {
  EXPECT_GT(check_token_bytes("llama-bpe", "llama-3.1-8b-instruct", false), 30);
  EXPECT_GT(check_token_bytes("qwen2", "qwen3-4b", false), 30);
  EXPECT_GT(check_token_bytes("phi-3", "phi-3-mini-4k-instruct", true), 30);
}

TEST(TokenizerVectors, LlamaBpeWithLlama31) { EXPECT_EQ(check_vectors("llama-bpe", "llama-3.1-8b-instruct"), 46); }

TEST(TokenizerVectors, Qwen2WithQwen3) { EXPECT_EQ(check_vectors("qwen2", "qwen3-4b"), 46); }

TEST(TokenizerVectors, Phi3WithPhi3) { EXPECT_EQ(check_vectors("phi-3", "phi-3-mini-4k-instruct"), 46); }

TEST(TokenizerVectors, LlamaSpmWithPhi3) { EXPECT_EQ(check_vectors("llama-spm", "phi-3-mini-4k-instruct"), 46); }

}  // namespace
}  // namespace linnet
