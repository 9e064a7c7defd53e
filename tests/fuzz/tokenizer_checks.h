// Checks the tokenizer fuzz targets run on a loaded Tokenizer: encode, decode and the
// streaming detokenizer must agree with what tokenizer.h promises.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loader/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace linnet::fuzz {

/// The ids of `text`, checked to lie in [0, vocab_size); empty when encode refuses it.
/// Invalid UTF-8 must be refused; valid UTF-8 may be refused only when `may_refuse` (a
/// fuzzed tokenizer.json can name an unk_token that is not in its vocabulary).
inline std::vector<int32_t> checked_encode(const Tokenizer& tok, std::string_view text, bool add_special,
                                           bool may_refuse) {
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text, add_special);
  } catch (const Error& e) {
    refused(e);
    if (valid_utf8(text) && !may_refuse) fail(std::string("encode refused valid UTF-8: ") + e.what());
    return {};
  }
  if (!valid_utf8(text)) fail("encode accepted invalid UTF-8");
  for (const int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) fail("encode gave id " + std::to_string(id) + " outside the vocabulary");
  }
  return ids;
}

/// decode(ids), or nullopt-like "" with ok = false when decode refuses an id.
inline std::string checked_decode(const Tokenizer& tok, std::span<const int32_t> ids, bool skip_special, bool& ok) {
  ok = true;
  try {
    return tok.decode(ids, skip_special);
  } catch (const Error& e) {
    refused(e);
    ok = false;
    return {};
  }
}

/// Streams ids[k..] after the prompt ids[0..k) through StreamingDetokenizer and checks
/// tokenizer.h's guarantee: the pieces add up to decode(all) minus decode(prompt)
/// whenever decode(prompt) is a prefix of decode(all); text comes out only at UTF-8
/// character boundaries. Also times the stream against one decode of everything: a
/// stream much slower than that is the quadratic re-decoding the window exists to avoid.
/// The text of streaming ids[k..] after the prompt ids[0..k), checked to be whole
/// UTF-8 characters piece by piece; `seconds` gets the time it took.
inline std::string stream_text(const Tokenizer& tok, const std::vector<int32_t>& ids, std::size_t k,
                               bool skip_special, double& seconds) {
  std::string streamed;
  const auto start = std::chrono::steady_clock::now();
  try {
    StreamingDetokenizer stream(tok, std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k)),
                                skip_special);
    for (std::size_t i = k; i < ids.size(); ++i) {
      const std::string piece = stream.push(ids[i]);
      if (!valid_utf8(piece)) fail("push() emitted text that is not whole UTF-8 characters");
      streamed += piece;
    }
    streamed += stream.flush();
  } catch (const Error& e) {
    refused(e);
    fail(std::string("the stream refused ids that decode accepted: ") + e.what());
  }
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return streamed;
}

/// Streams ids[k..] after the prompt ids[0..k) through StreamingDetokenizer and checks
/// tokenizer.h's guarantee: the pieces add up to decode(all) minus decode(prompt)
/// whenever decode(prompt) is a prefix of decode(all); text comes out only at UTF-8
/// character boundaries. Also times the stream of a long input against one decode of
/// everything: a stream much slower than that is the quadratic re-decoding the window
/// exists to avoid (a slow run is timed twice more, so a stall of the machine is not
/// taken for one).
inline void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, std::size_t k, bool skip_special) {
  if (k > ids.size()) k = ids.size();
  bool ok_all = false, ok_prompt = false;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string all = checked_decode(tok, ids, skip_special, ok_all);
  const double decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string prompt = checked_decode(tok, std::span<const int32_t>(ids).first(k), skip_special, ok_prompt);
  if (!ok_all || !ok_prompt) return;  // an id without a token: the stream refuses it too
  double stream_s = 0;
  const std::string streamed = stream_text(tok, ids, k, skip_special, stream_s);
  if (all.compare(0, prompt.size(), prompt) == 0 && streamed != all.substr(prompt.size())) {
    fail("streamed text differs from decode(all) - decode(prompt): got \"" + streamed + "\", expected \"" +
         all.substr(prompt.size()) + "\"");
  }
  const std::size_t n = ids.size() - k;
  const auto slow = [&](double s) { return s > 0.5 && s > 200 * decode_s + 0.05 * static_cast<double>(n) / 1000; };
  if (n >= 256 && slow(stream_s)) {
    for (int again = 0; again < 2 && slow(stream_s); ++again) {
      double s = 0;
      stream_text(tok, ids, k, skip_special, s);
      stream_s = std::min(stream_s, s);
    }
    if (slow(stream_s)) {
      fail("streaming " + std::to_string(n) + " ids took " + std::to_string(stream_s) + " s, decoding them all at once " +
           std::to_string(decode_s) + " s");
    }
  }
}

}  // namespace linnet::fuzz
