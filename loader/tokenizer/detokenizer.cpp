// StreamingDetokenizer: generated ids -> text, one id at a time, emitting only text
// that no later id can change.
//
// Method (vLLM, vllm/transformers_utils/detokenizer_utils.py, detokenize_incrementally):
// keep prefix_offset <= read_offset; each step decodes ids[prefix_offset:] and
// ids[prefix_offset:read_offset] and emits the difference. Decoding a window gives the
// same text as decoding the whole sequence once the window starts where decoding is
// local: not inside a run of byte tokens (ByteFallback decodes a run as a unit), and with
// non-empty text in [prefix_offset, read_offset), so a leading-space Strip treats both
// decodes the same way. Text is held (nothing emitted) while the ids end in a byte run,
// which a later invalid byte would turn into U+FFFDs, and while the window text ends in
// U+FFFD (an unfinished character, for decoders that decode bytes lossily).
#include "common/error.h"
#include "loader/tokenizer/tokenizer_parts.h"

namespace linnet {
namespace {

constexpr std::size_t kInitialWindow = 5;  // prompt ids re-decoded at the start, as vLLM
constexpr std::size_t kSettleEvery = 8;    // held ids between two emit_settled searches
constexpr std::size_t kSettleTries = 4;    // splits emit_settled tries, from the end
constexpr std::size_t kRestartTries = 4;   // window starts emit tries, from read_offset back
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tok, std::vector<int32_t> prompt_ids,
                                           bool skip_special_tokens)
    : tok_(tok), skip_special_(skip_special_tokens) {
  const Tokenizer::Impl& impl = *tok_.impl_;
  bytes_ = impl.decoder.byte_level_only();
  if (bytes_) {
    // The prompt's text is not emitted; an unfinished character at its end is kept.
    std::string bytes;
    for (const int32_t id : prompt_ids) {
      const std::string& token = impl.token_of(id);  // throws naming an out-of-range id
      if (!(skip_special_ && impl.special[id])) tok::append_token_bytes(token, bytes);
    }
    std::string discard;
    pending_ = bytes.substr(tok::append_utf8_lossy_prefix(bytes, /*final=*/false, discard));
    prompt_pending_ = !pending_.empty();
    read_offset_ = prefix_offset_ = 0;
    return;
  }
  ids_.reserve(prompt_ids.size() + 256);
  for (const int32_t id : prompt_ids) {
    impl.token_of(id);  // throws naming an out-of-range id
    if (!(skip_special_ && impl.special[id])) ids_.push_back(id);
  }
  read_offset_ = ids_.size();
  prefix_offset_ = read_offset_ > kInitialWindow ? read_offset_ - kInitialWindow : 0;
  while (true) {
    while (!is_window_start(prefix_offset_)) --prefix_offset_;
    prefix_text_ = decode_range(prefix_offset_, read_offset_);
    if (prefix_offset_ == 0 || !prefix_text_.empty()) break;
    --prefix_offset_;
  }
}

bool StreamingDetokenizer::is_window_start(std::size_t i) const {
  if (i == 0 || i >= ids_.size()) return true;
  const auto& byte_value = tok_.impl_->byte_value;
  return byte_value[ids_[i - 1]] < 0 || byte_value[ids_[i]] < 0;
}

std::string StreamingDetokenizer::decode_range(std::size_t begin, std::size_t end) const {
  return tok_.impl_->decode(std::span<const int32_t>(ids_).subspan(begin, end - begin),
                            skip_special_);
}

std::string StreamingDetokenizer::push(int32_t id) {
  const Tokenizer::Impl& impl = *tok_.impl_;
  const std::string& token = impl.token_of(id);  // throws naming an out-of-range id
  if (skip_special_ && impl.special[id]) return {};
  if (bytes_) {
    tok::append_token_bytes(token, pending_);
    return take_bytes(false);
  }
  ids_.push_back(id);
  if (impl.byte_value[id] >= 0) return {};  // inside a byte run: wait for its end
  return emit(false);
}

std::string StreamingDetokenizer::flush() {
  if (bytes_) return take_bytes(true);
  return emit(true);
}

std::string StreamingDetokenizer::take_bytes(bool final) {
  std::string out;
  const std::size_t used = tok::append_utf8_lossy_prefix(pending_, final, out);
  pending_.erase(0, used);
  if (prompt_pending_ && used > 0) {
    // The prompt ended inside a character. decode(prompt) showed it as U+FFFD: when
    // the new bytes break it, that U+FFFD is already shown; when they complete it, the
    // character is new text.
    prompt_pending_ = false;
    if (out.compare(0, kReplacement.size(), kReplacement) == 0) out.erase(0, kReplacement.size());
  }
  return out;
}

std::string StreamingDetokenizer::emit(bool force) {
  if (read_offset_ == ids_.size()) return {};
  std::string new_text = decode_range(prefix_offset_, ids_.size());
  if (!force && ends_with(new_text, kReplacement)) return emit_settled(new_text);
  if (!force && new_text.size() <= prefix_text_.size()) return {};
  std::string out;
  if (new_text.compare(0, prefix_text_.size(), prefix_text_) == 0) {
    out = new_text.substr(prefix_text_.size());
  } else {
    // Only when the prompt ends inside a byte run that the new ids change (e.g. an
    // unfinished character that now completes): emit from where the texts differ,
    // backed up to a character boundary.
    std::size_t common = 0;
    while (common < new_text.size() && common < prefix_text_.size() &&
           new_text[common] == prefix_text_[common]) {
      ++common;
    }
    while (common > 0 && (static_cast<unsigned char>(new_text[common]) & 0xC0) == 0x80) --common;
    out = new_text.substr(common);
  }

  // Advance the window to [w, end) for the latest valid window start w <= read_offset
  // whose text up to the new read_offset is not empty, trying a few ids back (a "▁"
  // alone decodes to nothing at the start of a window, so a run of them never had a
  // start at read_offset); otherwise keep the start and let the window grow.
  const std::size_t old_read = read_offset_;
  read_offset_ = ids_.size();
  for (std::size_t w = old_read, tries = 0; w > prefix_offset_ && tries < kRestartTries; --w, ++tries) {
    if (!is_window_start(w)) continue;
    std::string next_prefix = decode_range(w, read_offset_);
    if (next_prefix.empty()) continue;
    prefix_offset_ = w;
    prefix_text_ = std::move(next_prefix);
    return out;
  }
  prefix_text_ = std::move(new_text);
  return out;
}

std::string StreamingDetokenizer::emit_settled(const std::string& new_text) {
  // Held while the text ends in U+FFFD: an unfinished character may still complete. But
  // a U+FFFD that no later id can change (a lone continuation byte, an invalid byte run
  // followed by more text) must not keep the window growing, or every push re-decodes
  // all the held ids (quadratic in a run of invalid bytes). So every kSettleEvery held
  // ids, look for a split s among the last few ids where the window decodes in two
  // independent halves: decode(window[..s)) + decode([s..)) == decode(window), with
  // [s..) non-empty. Then only the tail [s..) can still change: the head's text is
  // emitted and the window restarts at s. (A byte-level decoder's unfinished character
  // is at most 3 bytes, so one of the last 4 splits works unless ids decode to nothing.)
  const std::size_t held = ids_.size() - read_offset_;
  if (held < kSettleEvery || held % kSettleEvery != 0) return {};
  const std::size_t end = ids_.size();
  for (std::size_t s = end - 1; s > read_offset_ && s + kSettleTries >= end; --s) {
    if (!is_window_start(s)) continue;
    std::string head = decode_range(prefix_offset_, s);
    if (head.size() < prefix_text_.size() || head.compare(0, prefix_text_.size(), prefix_text_) != 0) continue;
    const std::string tail = decode_range(s, end);
    if (tail.empty() || head.size() + tail.size() != new_text.size() ||
        new_text.compare(0, head.size(), head) != 0 || new_text.compare(head.size(), tail.size(), tail) != 0) {
      continue;
    }
    std::string out = head.substr(prefix_text_.size());
    prefix_offset_ = s;
    read_offset_ = s;
    prefix_text_.clear();
    return out;
  }
  return {};
}

}  // namespace linnet
