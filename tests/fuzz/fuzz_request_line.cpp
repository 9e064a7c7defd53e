// Fuzz target: JSONL request lines of `generate --input` and `loss`, parsed and
// validated into settings as the commands do, with stories260k's tokenizer (vocabulary
// 512) and the Qwen3 or Llama-3.1 chat template for "messages" lines.
//
// Input: the text of a JSONL file; every non-blank line (split at '\n', as
// read_jsonl_lines does) goes through parse_jsonl_line, then
//  - generate: read_request_line (apply_request_keys, stop_token_ids < vocab, the prompt
//    text raw or rendered, with or without --chat), encode, batch_request, and the
//    streamed completion (CompletionStream, the prompt's own ids as "generated" tokens)
//    must equal completion_text;
//  - loss: parse_loss_document, whose ids and labels must lie in the vocabulary.
// Accepted settings must be inside the ranges apply_request_keys documents.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "requests/request.h"
#include "requests/jsonl_input.h"
#include "requests/loss_document.h"
#include "requests/request_settings.h"
#include "loader/chat/chat_template.h"
#include "loader/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

using namespace linnet;
using nlohmann::ordered_json;

namespace {

constexpr int64_t kVocab = 512;  // stories260k's config.json

struct Fixture {
  Tokenizer tok;
  ModelChatTemplate qwen3, llama;
};

const Fixture& fixture() {
  static const Fixture* f = [] {
    Tokenizer tok = Tokenizer::from_dir(fuzz::shared_dir() / "models/stories260k");
    const auto dir = fuzz::test_data() / "chat_templates";
    ModelChatTemplate qwen3{ChatTemplate::parse(fuzz::read_file(dir / "qwen3.jinja"), "qwen3.jinja"), {}};
    qwen3.special_tokens.eos_token = "<|im_end|>";
    ModelChatTemplate llama{ChatTemplate::parse(fuzz::read_file(dir / "llama-3.1-8b-instruct.jinja"), "llama.jinja"),
                            {}};
    llama.special_tokens.bos_token = "<|begin_of_text|>";
    llama.special_tokens.eos_token = "<|eot_id|>";
    return new Fixture{std::move(tok), std::move(qwen3), std::move(llama)};
  }();
  return *f;
}

RequestSettings defaults() {
  RequestSettings s;
  s.sampling.temperature = 0.7;
  s.sampling.top_k = 50;
  s.max_new_tokens = 16;
  s.stop = {"\n\n"};
  s.stop_token_ids = {2};
  return s;
}

void check_settings(const RequestSettings& s, const ordered_json& line) {
  const SamplingParams& p = s.sampling;
  if (!temperature_ok(p.temperature) || !top_p_ok(p.top_p) || !min_p_ok(p.min_p) ||
      !penalty_ok(p.repetition_penalty) || !openai_penalty_ok(p.presence_penalty) ||
      !openai_penalty_ok(p.frequency_penalty)) {
    fuzz::fail("accepted sampling settings out of range: " + line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  if (p.top_k < 0 || s.max_new_tokens < 0) fuzz::fail("accepted a negative top_k / max_new_tokens");
  if (s.top_logprobs < -1 || s.top_logprobs > kMaxTopLogprobs) fuzz::fail("accepted top_logprobs out of range");
  for (const auto& stop : s.stop) {
    if (stop.empty()) fuzz::fail("accepted an empty stop string");
  }
  for (const int64_t id : s.stop_token_ids) {
    if (id < 0 || id >= kVocab) fuzz::fail("accepted a stop token id outside the vocabulary");
  }
}

void generate_line(const Fixture& f, const ordered_json& line, int n, bool chat_flag, bool llama) {
  Request r;
  r.index = n - 1;
  r.where = "fuzz.jsonl:" + std::to_string(n);
  const ModelChatTemplate& chosen = llama ? f.llama : f.qwen3;
  auto chat = std::make_unique<ModelChatTemplate>(chosen);
  bool is_chat = false;
  try {
    read_request_line(line, defaults(), kVocab, chat_flag, f.tok, "/nonexistent/model", chat, r, is_chat);
  } catch (const Error& e) {
    fuzz::refused(e);
    return;
  }
  check_settings(r.settings, line);
  if (r.text.size() > (std::size_t{1} << 16)) return;  // generate refuses these by bytes first
  try {
    r.ids = f.tok.encode(r.text, /*add_special_tokens=*/!is_chat);
  } catch (const Error& e) {
    fuzz::refused(e);
    if (fuzz::valid_utf8(r.text)) fuzz::fail(std::string("encode refused a valid prompt: ") + e.what());
    return;
  }
  const BatchRequest b = batch_request(r, {2}, 1234);
  if (b.prompt != r.ids || b.max_new_tokens != r.settings.max_new_tokens) fuzz::fail("batch_request lost a setting");
  // The prompt's own ids (at most 64) as the "generated" tokens.
  std::vector<int32_t> gen(r.ids.begin(), r.ids.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(r.ids.size(), 64)));
  CompletionStream stream(f.tok, r);
  std::string shown;
  for (const int32_t id : gen) shown += stream.push(id);
  shown += stream.finish();
  bool stopped = false;
  const std::string whole = completion_text(f.tok, r, gen, stopped);
  if (shown != whole) fuzz::fail("streamed completion \"" + shown + "\" != completion_text \"" + whole + "\"");
  if (stopped != stream.stopped()) fuzz::fail("CompletionStream and completion_text disagree on a stop string");
}

void loss_line(const Fixture& f, const ordered_json& line, int n) {
  try {
    const LossDocument d = parse_loss_document(line, "fuzz.jsonl:" + std::to_string(n), &f.tok, kVocab);
    if (d.ids.size() != d.labels.size()) fuzz::fail("ids and labels differ in length");
    for (std::size_t i = 0; i < d.ids.size(); ++i) {
      if (d.ids[i] < 0 || d.ids[i] >= kVocab) fuzz::fail("a document id outside the vocabulary");
      if (d.labels[i] != -100 && (d.labels[i] < 0 || d.labels[i] >= kVocab)) fuzz::fail("a label outside the vocabulary");
    }
  } catch (const Error& e) {
    fuzz::refused(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& f = fixture();
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  int n = 0;
  for (std::size_t start = 0; start <= in.size();) {
    std::size_t end = in.find('\n', start);
    if (end == std::string_view::npos) end = in.size();
    const std::string text(in.substr(start, end - start));
    start = end + 1;
    ++n;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    ordered_json line;
    try {
      line = parse_jsonl_line(text, "fuzz.jsonl:" + std::to_string(n));
    } catch (const Error& e) {
      fuzz::refused(e);
      continue;
    }
    generate_line(f, line, n, /*chat_flag=*/(size & 1) != 0, /*llama=*/(size & 2) != 0);
    loss_line(f, line, n);
  }
  return 0;
}
