// Fuzz target: encode / decode / streaming detokenization with real tokenizers.
//
// Fixed tokenizers, loaded once: stories260k (SentencePiece-style BPE with byte
// fallback), three synthetic ones of tests/data/tokenizers/synthetic.json (Metaspace,
// byte-level with added tokens, a Split pre-tokenizer) and, when ../shared has the
// model cards, Llama-3.1, Qwen3 and Phi-3.
//
// Input: SELECT FLAGS PAYLOAD. SELECT picks the tokenizer; FLAGS bit 0 add_special,
// bit 1 skip_special, bit 2 PAYLOAD is ids (3 bytes each, modulo the vocabulary) instead
// of text, bits 3-4 where the prompt ends (0, 1/3, 2/3, all but the last), bits 5-7 all
// set: the payload is repeated to a long input (2048 ids, or 16 KiB of text), which must
// still stream and encode in time linear in its length.
// Checks: tokenizer_checks.h, and for Llama-3.1 (byte-level, no normalizer) that
// decode(encode(text), skip_special = false) gives the text back.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tokenizer_checks.h"

using namespace linnet;

namespace {

struct Loaded {
  std::string name;
  Tokenizer tok;
  bool round_trips = false;  // decode(encode(t)) == t for valid UTF-8 t
};

std::vector<Loaded>& tokenizers() {
  static std::vector<Loaded>* all = [] {
    auto* v = new std::vector<Loaded>;
    const auto shared = fuzz::shared_dir();
    v->push_back({"stories260k", Tokenizer::from_dir(shared / "models/stories260k")});
    const nlohmann::json synthetic =
        nlohmann::json::parse(fuzz::read_file(fuzz::test_data() / "tokenizers/synthetic.json"));
    for (const auto& t : synthetic.at("tokenizers")) {
      const std::string name = t.at("name").get<std::string>();
      if (name != "metaspace_first" && name != "bytelevel_added_tokens" && name != "split_isolated") continue;
      v->push_back({name, Tokenizer::from_json_text(t.at("tokenizer").dump(), std::nullopt, name)});
    }
    for (const char* card : {"llama-3.1-8b-instruct", "qwen3-4b", "phi-3-mini-4k-instruct"}) {
      const auto dir = shared / "models/cards" / card;
      if (!std::filesystem::exists(dir / "tokenizer.json")) continue;
      v->push_back({card, Tokenizer::from_dir(dir), std::string_view(card).starts_with("llama")});
    }
    std::fprintf(stderr, "fuzz_tokenizer_codec: %zu tokenizers\n", v->size());
    return v;
  }();
  return *all;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const auto& all = tokenizers();
  const Loaded& t = all[data[0] % all.size()];
  const Tokenizer& tok = t.tok;
  const uint8_t flags = data[1];
  const bool add_special = flags & 1;
  const bool skip_special = flags & 2;
  const bool id_mode = flags & 4;
  const int split = (flags >> 3) & 3;
  const bool amplify = (flags >> 5) == 7;
  const std::string_view payload(reinterpret_cast<const char*>(data + 2), size - 2);

  std::vector<int32_t> ids;
  if (id_mode) {
    const auto vocab = static_cast<uint32_t>(tok.vocab_size());
    for (std::size_t i = 0; i + 3 <= payload.size(); i += 3) {
      const uint32_t v = static_cast<uint8_t>(payload[i]) | static_cast<uint8_t>(payload[i + 1]) << 8 |
                         static_cast<uint32_t>(static_cast<uint8_t>(payload[i + 2])) << 16;
      ids.push_back(static_cast<int32_t>(v % vocab));
    }
    if (amplify && !ids.empty()) {
      const std::size_t unit = ids.size();
      while (ids.size() < 2048) ids.push_back(ids[ids.size() - unit]);
    }
  } else {
    std::string text(payload);
    if (amplify && !text.empty()) {
      while (text.size() < 16384) text += payload;
      const auto t0 = std::chrono::steady_clock::now();
      fuzz::checked_encode(tok, text, add_special, /*may_refuse=*/false);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > 2.0) fuzz::fail(t.name + ": encoding " + std::to_string(text.size()) + " bytes took " + std::to_string(s) + " s");
      text = std::string(payload);
    }
    ids = fuzz::checked_encode(tok, text, add_special, /*may_refuse=*/false);
    if (t.round_trips && !ids.empty()) {
      const std::vector<int32_t> plain = fuzz::checked_encode(tok, text, false, false);
      bool ok = false;
      const std::string back = fuzz::checked_decode(tok, plain, /*skip_special=*/false, ok);
      if (!ok) fuzz::fail(t.name + ": decode refused ids that encode gave");
      if (back != text) fuzz::fail(t.name + ": decode(encode(text)) != text");
    }
  }
  const std::size_t k = split == 0 ? 0 : split == 3 ? (ids.empty() ? 0 : ids.size() - 1) : ids.size() * split / 3;
  fuzz::check_stream(tok, ids, k, skip_special);
  return 0;
}
