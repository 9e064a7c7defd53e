// Fuzz target: tokenizer.json (+ tokenizer_config.json) load, then encode / decode /
// stream with the tokenizer it describes.
//
// Input: TOKENIZER_JSON [ '\0' CONFIG_JSON [ '\0' TEXT ] ] (an empty CONFIG_JSON means
// no tokenizer_config.json). A tokenizer that loads encodes TEXT and a few fixed
// strings; every id it gives must decode, the decode of the first ids of the
// vocabulary must not fail in any other way than naming a missing id, and the streaming
// detokenizer must add up to decode (tokenizer_checks.h).
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "loader/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tokenizer_checks.h"

using namespace linnet;

namespace {

constexpr std::string_view kTexts[] = {
    "Hello world! It's 2024, isn't it?",
    " leading  spaces\tand\nnewlines\n\n",
    "<s>special</s> <unk> <|endoftext|>",
    "naïve café — 日本語 🙂",
};

void exercise(const Tokenizer& tok, std::string_view text, bool add_special) {
  std::vector<int32_t> ids = fuzz::checked_encode(tok, text, add_special, /*may_refuse=*/true);
  for (const bool skip : {false, true}) {
    bool ok = false;
    fuzz::checked_decode(tok, ids, skip, ok);
    fuzz::check_stream(tok, ids, ids.size() / 2, skip);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::size_t cut1 = in.find('\0');
  const std::string_view tokenizer_json = in.substr(0, cut1);
  std::optional<std::string_view> config;
  std::string_view text;
  if (cut1 != std::string_view::npos) {
    const std::string_view rest = in.substr(cut1 + 1);
    const std::size_t cut2 = rest.find('\0');
    if (cut2 != 0 && !rest.substr(0, cut2).empty()) config = rest.substr(0, cut2);
    if (cut2 != std::string_view::npos) text = rest.substr(cut2 + 1);
  }
  std::optional<Tokenizer> tok;
  try {
    tok = Tokenizer::from_json_text(tokenizer_json, config, "fuzz/tokenizer.json", "fuzz/tokenizer_config.json");
  } catch (const Error& e) {
    fuzz::refused(e);
    return 0;
  }
  const int64_t vocab = tok->vocab_size();
  if (vocab < 0) fuzz::fail("negative vocab_size");
  exercise(*tok, text, true);
  for (const std::string_view t : kTexts) exercise(*tok, t, false);
  // The first ids of the vocabulary, each alone and all together (byte runs, specials).
  std::vector<int32_t> first;
  for (int32_t id = 0; id < vocab && id < 300; ++id) {
    try {
      tok->id_to_token(id);
      first.push_back(id);
    } catch (const Error& e) {
      fuzz::refused(e);
    }
  }
  for (const bool skip : {false, true}) fuzz::check_stream(*tok, first, first.size() / 3, skip);
  for (const int32_t id : {int32_t{-1}, static_cast<int32_t>(vocab)}) {
    try {
      tok->decode(std::vector<int32_t>{id});
      fuzz::fail("decode accepted id " + std::to_string(id) + " outside the vocabulary");
    } catch (const Error& e) {
      fuzz::refused(e);
    }
  }
  if (const auto bos = tok->bos_token_id(); bos && (*bos < 0 || *bos >= vocab)) fuzz::fail("bos id out of range");
  if (const auto eos = tok->eos_token_id(); eos && (*eos < 0 || *eos >= vocab)) fuzz::fail("eos id out of range");
  return 0;
}
