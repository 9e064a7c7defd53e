#include "requests/request.h"

#include <algorithm>

#include "common/error.h"
#include "common/utf8.h"
#include "requests/jsonl_input.h"
#include "loader/chat/chat_template.h"

namespace linnet {

using nlohmann::ordered_json;

std::string user_message_request(const std::string& prompt) {
  ordered_json r;
  r["messages"] = ordered_json::array({{{"role", "user"}, {"content", prompt}}});
  r["add_generation_prompt"] = true;
  return r.dump();
}

RequestSettings generation_defaults(const GenerationConfig& g) {
  RequestSettings s;
  SamplingParams& p = s.sampling;
  const bool do_sample = g.do_sample.value_or(false);
  p.temperature = do_sample ? g.temperature.value_or(1.0) : 0.0;
  p.top_k = g.top_k.value_or(50);
  p.top_p = g.top_p.value_or(1.0);
  p.min_p = g.min_p.value_or(0.0);
  p.repetition_penalty = g.repetition_penalty.value_or(1.0);
  s.max_new_tokens = g.max_new_tokens.value_or(256);
  return s;
}

int64_t prompt_bytes_per_token(const Tokenizer& tok) {
  int64_t longest = kMinPromptBytesPerToken;
  for (int64_t id = 0; id < tok.vocab_size(); ++id) {
    try {
      longest = std::max<int64_t>(longest, static_cast<int64_t>(tok.id_to_token(static_cast<int32_t>(id)).size()));
    } catch (const Error&) {
      // an id without an entry covers no text
    }
  }
  return longest;
}

std::vector<int64_t> resolve_eos(const ModelFiles& files, const Tokenizer& tok) {
  if (!files.generation.eos_token_ids.empty()) return files.generation.eos_token_ids;
  if (!files.config.eos_token_ids.empty()) return files.config.eos_token_ids;
  if (auto id = tok.eos_token_id()) return {*id};
  return {};
}

// The prompt text of one input line: raw text, or a chat request rendered by the
// model's template (loaded on first use).
std::string prompt_text(const ordered_json& line, bool chat_flag, const Tokenizer& tok,
                        const std::filesystem::path& model_dir, std::unique_ptr<ModelChatTemplate>& chat,
                        const std::string& where, bool& is_chat) {
  ordered_json request;
  if (line.contains("messages")) {
    if (line.contains("prompt")) throw Error("give \"prompt\" or \"messages\", not both", where);
    request = line;
    if (!request.contains("add_generation_prompt")) request["add_generation_prompt"] = true;
  } else {
    const auto it = line.find("prompt");
    if (it == line.end() || !it->is_string()) {
      throw Error("each line must be an object with a string \"prompt\" or a \"messages\" list", where);
    }
    // A misspelt key would otherwise silently fall back to its default. (A "messages"
    // line's other keys are template variables, so those are not checked.)
    check_known_keys(line,
                     {"prompt", "temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                      "presence_penalty", "frequency_penalty", "seed",
                      "max_new_tokens", "stop", "stop_token_ids", "logprobs", "top_logprobs"},
                     "a \"prompt\" line", where);
    if (!chat_flag) {
      is_chat = false;
      return it->get<std::string>();
    }
    // The message goes through JSON, which cannot hold invalid UTF-8: named here first.
    check_utf8(it->get_ref<const std::string&>(), where);
    request = ordered_json::parse(user_message_request(it->get<std::string>()));
  }
  is_chat = true;
  if (!chat) chat = std::make_unique<ModelChatTemplate>(load_chat_template(tok, model_dir));
  try {
    return chat->chat_template.render(chat_variables(request, chat->special_tokens, where));
  } catch (const Error& e) {
    throw e.at(where);
  }
}

void read_request_line(const ordered_json& line, const RequestSettings& defaults, int64_t vocab_size, bool chat_flag,
                       const Tokenizer& tok, const std::filesystem::path& model_dir,
                       std::unique_ptr<ModelChatTemplate>& chat, Request& r, bool& is_chat) {
  r.settings = apply_request_keys(line, defaults, r.where);
  for (int64_t id : r.settings.stop_token_ids) {
    if (id >= vocab_size) {
      // The flag's ids are every line's default: name the flag unless the line set them.
      const auto it = line.find("stop_token_ids");
      const bool from_line = it != line.end() && !it->is_null();
      throw Error("invalid value", from_line ? r.where + ": key \"stop_token_ids\"" : std::string("--stop-token-ids"),
                  "ids < vocab_size = " + std::to_string(vocab_size), std::to_string(id));
    }
  }
  r.text = prompt_text(line, chat_flag, tok, model_dir, chat, r.where, is_chat);
}

// The completion text of `ids` after `prompt`, cut before the first stop string it
// holds (vLLM's rule); `stopped` tells whether one was found.
std::string completion_text(const Tokenizer& tok, const Request& r, const std::vector<int32_t>& ids, bool& stopped) {
  StreamingDetokenizer stream(tok, r.ids);
  std::string text;
  for (int32_t id : ids) text += stream.push(id);
  text += stream.flush();
  size_t cut = std::string::npos;
  for (const auto& s : r.settings.stop) cut = std::min(cut, text.find(s));
  stopped = cut != std::string::npos;
  if (stopped) text.resize(cut);
  return text;
}

std::string token_text(const Tokenizer& tok, int32_t id) {
  try {
    return tok.decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
  } catch (const Error&) {
    return {};
  }
}

// One output line: {index, prompt, completion, prompt_ids, completion_ids,
// finish_reason, [error], prompt_tokens, completion_tokens, [logprobs]}.
ordered_json output_line(const Tokenizer& tok, const Request& r, const GenerationResult& g, std::string& completion) {
  bool stopped = false;
  completion = completion_text(tok, r, g.ids, stopped);
  ordered_json j;
  j["index"] = r.index;
  j["prompt"] = r.text;
  j["completion"] = completion;
  j["prompt_ids"] = r.ids;
  j["completion_ids"] = g.ids;
  // A stop string that only showed once the detokenizer flushed still ends the text.
  j["finish_reason"] = stopped && g.finish_reason == "length" ? std::string("stop") : g.finish_reason;
  if (g.finish_reason == "error") j["error"] = g.error;
  j["prompt_tokens"] = r.ids.size();
  j["completion_tokens"] = g.ids.size();
  if (r.settings.top_logprobs >= 0 && g.logprobs.size() == g.ids.size()) {
    ordered_json list = ordered_json::array();
    for (size_t k = 0; k < g.ids.size(); ++k) {
      ordered_json t;
      t["id"] = g.ids[k];
      t["token"] = token_text(tok, g.ids[k]);
      t["logprob"] = g.logprobs[k].logprob;
      if (r.settings.top_logprobs > 0) {
        ordered_json top = ordered_json::array();
        for (const auto& [id, lp] : g.logprobs[k].top) {
          top.push_back({{"id", id}, {"token", token_text(tok, id)}, {"logprob", lp}});
        }
        t["top_logprobs"] = std::move(top);
      }
      list.push_back(std::move(t));
    }
    j["logprobs"] = std::move(list);
  }
  return j;
}

std::string dump_line(const ordered_json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

BatchRequest batch_request(const Request& r, const std::vector<int64_t>& eos, uint64_t seed) {
  BatchRequest b;
  b.prompt = r.ids;
  b.sampling = r.settings.sampling;
  b.sampling.seed = seed;
  b.max_new_tokens = r.settings.max_new_tokens;
  b.eos_ids = eos;
  b.eos_ids.insert(b.eos_ids.end(), r.settings.stop_token_ids.begin(), r.settings.stop_token_ids.end());
  b.top_logprobs = r.settings.top_logprobs;
  b.error = r.error;
  return b;
}

StopFinder::StopFinder(const std::vector<std::string>& stops) {
  for (const std::string& t : stops) {
    if (t.empty()) continue;
    Stop st{t, std::vector<uint32_t>(t.size(), 0), 0};
    for (size_t i = 1, k = 0; i < t.size(); ++i) {
      while (k > 0 && t[i] != t[k]) k = st.fail[k - 1];
      if (t[i] == t[k]) ++k;
      st.fail[i] = static_cast<uint32_t>(k);
    }
    stops_.push_back(std::move(st));
  }
}

size_t StopFinder::feed(std::string_view more) {
  size_t first = std::string::npos;
  for (Stop& st : stops_) {
    size_t k = st.matched;
    bool found = false;
    for (size_t i = 0; i < more.size(); ++i) {
      while (k > 0 && more[i] != st.text[k]) k = st.fail[k - 1];
      if (more[i] == st.text[k]) ++k;
      if (k == st.text.size()) {
        if (!found) first = std::min(first, fed_ + i + 1 - k);  // its first match here
        found = true;
        k = st.fail[k - 1];
      }
    }
    st.matched = k;
  }
  fed_ += more.size();
  return first;
}

CompletionStream::CompletionStream(const Tokenizer& tok, const Request& r)
    : stream_(tok, r.ids), stops_(r.settings.stop) {
  for (const auto& s : r.settings.stop) hold_ = std::max(hold_, s.size() - 1);
}

std::string CompletionStream::push(int32_t token) {
  if (stopped()) return {};
  const std::string more = stream_.push(token);
  text_ += more;
  cut_ = std::min(cut_, stops_.feed(more));
  return release(false);
}

std::string CompletionStream::finish() {
  if (!stopped()) {
    const std::string more = stream_.flush();
    text_ += more;
    cut_ = std::min(cut_, stops_.feed(more));
  }
  return release(true);
}

std::string CompletionStream::release(bool final) {
  size_t upto = final ? text_.size() : (text_.size() > hold_ ? text_.size() - hold_ : 0);
  if (stopped()) upto = std::min(upto, cut_);
  // The held-back tail is counted in bytes: never end a piece inside a character (text_
  // holds whole characters, so the boundary is at most 3 continuation bytes back). A stop
  // string, being valid UTF-8, always starts on one.
  while (upto > shown_ && upto < text_.size() && (static_cast<unsigned char>(text_[upto]) & 0xC0) == 0x80) --upto;
  if (upto <= shown_) return {};
  std::string out = text_.substr(shown_, upto - shown_);
  shown_ = upto;
  return out;
}

bool StopScan::push(const Tokenizer& tok, const Request& r, int32_t token) {
  if (r.settings.stop.empty()) return false;
  if (!stream_) {
    stream_ = std::make_unique<StreamingDetokenizer>(tok, r.ids);
    stops_ = std::make_unique<StopFinder>(r.settings.stop);
  }
  // Only a match that ends in the new text is new.
  return stops_->feed(stream_->push(token)) != std::string::npos;
}

}  // namespace linnet
