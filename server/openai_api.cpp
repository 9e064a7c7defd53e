#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/error.h"
#include "common/utf8.h"
#include "requests/jsonl_input.h"

namespace linnet {

using nlohmann::ordered_json;

namespace {

const char* default_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status == 429) return "rate_limit_exceeded";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

std::string brief(const ordered_json& v) {
  std::string text = dump_json(v);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

[[noreturn]] void bad(const std::string& param, const std::string& expected, const ordered_json& v) {
  throw ApiError(400, "invalid value for \"" + param + "\": expected " + expected + ", got " + brief(v), param);
}

// The kind of a JSON text that parsed but is no object, from its first character.
const char* json_kind(std::string_view text) {
  const size_t at = text.find_first_not_of(" \t\r\n");
  const char c = at == std::string_view::npos ? ' ' : text[at];
  if (c == '[') return "array";
  if (c == '"') return "string";
  if (c == 't' || c == 'f') return "boolean";
  if (c == 'n') return "null";
  return "number";
}

const ordered_json* key_of(const ordered_json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

// A request body: one JSON object (parse_jsonl_line's checks: NUL bytes, depth,
// duplicate keys), else the 400 that says what it is instead.
ordered_json parse_body(const std::string& text) {
  try {
    return parse_jsonl_line(text, "request body");
  } catch (const Error& e) {
    // An HTTP body is one JSON object, not a line of a file.
    if (e.what_part() == "each line must be a JSON object") {
      throw ApiError(400, "the request body must be a JSON object, not a JSON " + std::string(json_kind(text)));
    }
    throw ApiError(400, e.what());
  }
}

// A "model" key, when given, names the served model (404 otherwise, as OpenAI answers).
void check_model(const ordered_json& body, const ApiModel& model) {
  const ordered_json* m = key_of(body, "model");
  if (!m) return;
  if (!m->is_string()) bad("model", "a string", *m);
  if (m->get<std::string>() != model.served_name) {
    throw ApiError(404, "The model `" + m->get<std::string>() + "` does not exist (this server serves `" +
                            model.served_name + "`)",
                   "model", "", "model_not_found");
  }
}

// An integer in [0, 2^63 - 1]. JSON integers from 2^63 to 2^64 - 1 parse as unsigned and
// would wrap to negative as int64 (larger ones parse as floats, which are no counts).
bool is_count(const ordered_json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
  return v.is_number_integer() && v.get<int64_t>() >= 0;
}

// The parameter an apply_request_keys error names ('... key "temperature"'), in the
// API's spelling.
std::string param_of(const Error& e, bool chat) {
  const std::string& where = e.where();
  const size_t k = where.find("key \"");
  if (k == std::string::npos) return {};
  const size_t end = where.find('"', k + 5);
  std::string key = where.substr(k + 5, end == std::string::npos ? std::string::npos : end - k - 5);
  if (key == "max_new_tokens") return chat ? "max_completion_tokens" : "max_tokens";
  return key;
}

// Chat message content as a template sees it: a string, or the text parts of a list
// joined with newlines (vLLM's rule); null stays null (an assistant turn with tools).
ordered_json normalize_messages(const ordered_json& messages) {
  if (!messages.is_array() || messages.empty()) bad("messages", "a non-empty list of message objects", messages);
  ordered_json out = ordered_json::array();
  for (const auto& m : messages) {
    if (!m.is_object()) bad("messages", "a list of message objects", m);
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) bad("messages", "each message with a string \"role\"", m);
    ordered_json copy = m;
    const auto content = m.find("content");
    if (content != m.end() && content->is_array()) {
      std::string text;
      for (const auto& part : *content) {
        const auto type = part.is_object() ? part.find("type") : part.end();
        if (!part.is_object() || type == part.end() || *type != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          throw ApiError(400, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported",
                         "messages");
        }
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
      copy["content"] = text;
    } else if (content != m.end() && !content->is_string() && !content->is_null()) {
      bad("messages", "message content as a string or a list of text parts", *content);
    }
    out.push_back(std::move(copy));
  }
  return out;
}

// Keys accepted by each endpoint; the ones only accepted with their default value.
const std::vector<std::string> kCommonKeys = {
    "model", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "seed", "stop", "stop_token_ids", "n", "stream", "stream_options", "user",
    "max_tokens", "logprobs", "logit_bias", "best_of", "ignore_eos"};
const std::vector<std::string> kCompletionKeys = {"prompt", "echo", "suffix"};
const std::vector<std::string> kChatKeys = {"messages", "max_completion_tokens", "top_logprobs",
                                            "chat_template_kwargs", "tools", "tool_choice",
                                            "parallel_tool_calls", "response_format"};

void check_keys(const ordered_json& body, bool chat) {
  for (const auto& [key, value] : body.items()) {
    const auto& extra = chat ? kChatKeys : kCompletionKeys;
    if (std::find(kCommonKeys.begin(), kCommonKeys.end(), key) != kCommonKeys.end()) continue;
    if (std::find(extra.begin(), extra.end(), key) != extra.end()) continue;
    throw ApiError(400, "unknown parameter \"" + key + "\"", key);
  }
  // Accepted only where they change nothing.
  auto unsupported = [&](const char* key, bool ok) {
    const ordered_json* v = key_of(body, key);
    if (v && !ok) throw ApiError(400, std::string("\"") + key + "\" is not supported", key);
  };
  const ordered_json* v = nullptr;
  unsupported("logit_bias", !(v = key_of(body, "logit_bias")) || (v->is_object() && v->empty()));
  unsupported("best_of", !(v = key_of(body, "best_of")) || (v->is_number_integer() && v->get<int64_t>() == 1));
  unsupported("suffix", !(v = key_of(body, "suffix")) || (v->is_string() && v->get<std::string>().empty()));
  unsupported("ignore_eos", !(v = key_of(body, "ignore_eos")) || (v->is_boolean() && !v->get<bool>()));
  unsupported("tool_choice", !(v = key_of(body, "tool_choice")) || *v == "none" || *v == "auto");
  unsupported("response_format", !(v = key_of(body, "response_format")) ||
                                     (v->is_object() && v->value("type", "") == "text"));
  if ((v = key_of(body, "parallel_tool_calls")) && !v->is_boolean()) bad("parallel_tool_calls", "true or false", *v);
  if ((v = key_of(body, "user")) && !v->is_string()) bad("user", "a string", *v);
}

}  // namespace

ApiError::ApiError(int status, std::string message, std::string param, std::string type, std::string code)
    : std::runtime_error(std::move(message)),
      status_(status),
      param_(std::move(param)),
      type_(type.empty() ? default_type(status) : std::move(type)),
      code_(std::move(code)) {}

ordered_json ApiError::body() const {
  ordered_json e;
  e["message"] = what();
  e["type"] = type_;
  e["param"] = param_.empty() ? ordered_json() : ordered_json(param_);
  e["code"] = code_.empty() ? ordered_json() : ordered_json(code_);
  return {{"error", e}};
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Every byte of the longer one is looked at whatever matches; the length difference
  // is folded in too.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  volatile unsigned char sink = diff;
  return sink == 0;
}

namespace {

// The chat `messages` of `body` rendered by the model's template, with the body's
// chat_template_kwargs and tools; add_generation_prompt as given, else the kwargs', else
// true. 400 naming "messages" when the model has no template or it refuses them.
std::string render_chat(const ordered_json& body, const ordered_json& messages, const ApiModel& model,
                        std::optional<bool> add_generation_prompt) {
  if (!model.chat) throw ApiError(400, model.chat_error, "messages");
  ordered_json variables = ordered_json::object();
  if (const ordered_json* kw = key_of(body, "chat_template_kwargs")) {
    if (!kw->is_object()) bad("chat_template_kwargs", "an object", *kw);
    if (kw->contains("messages")) {
      throw ApiError(400, "\"chat_template_kwargs\" cannot set messages", "chat_template_kwargs");
    }
    variables = *kw;  // one copy (a key-by-key insert searches the ordered object each time)
  }
  variables["messages"] = normalize_messages(messages);
  if (const ordered_json* tools = key_of(body, "tools")) {
    if (!tools->is_array()) bad("tools", "a list of tool objects", *tools);
    variables["tools"] = *tools;
  }
  if (add_generation_prompt) {
    variables["add_generation_prompt"] = *add_generation_prompt;
  } else if (!variables.contains("add_generation_prompt")) {
    variables["add_generation_prompt"] = true;
  }
  bool is_chat = false;
  try {
    // A copy (shared, immutable tables), so prompt_text never loads one here.
    std::unique_ptr<ModelChatTemplate> chat_copy = std::make_unique<ModelChatTemplate>(*model.chat);
    return prompt_text(variables, true, *model.tokenizer, model.model_dir, chat_copy, "messages", is_chat);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "messages");
  }
}

}  // namespace

namespace {

// n, stream, stream_options and (completions) echo: how the response is shaped.
void read_response_keys(const ordered_json& body, bool chat, const ApiLimits& limits, ApiRequest& req) {
  if (const ordered_json* v = key_of(body, "n")) {
    if (!is_count(*v) || v->get<int64_t>() < 1 || v->get<int64_t>() > limits.max_n) {
      bad("n", "an integer in [1, " + std::to_string(limits.max_n) + "]", *v);
    }
    req.n = v->get<int64_t>();
  }
  if (const ordered_json* v = key_of(body, "stream")) {
    if (!v->is_boolean()) bad("stream", "true or false", *v);
    req.stream = v->get<bool>();
  }
  if (const ordered_json* v = key_of(body, "stream_options")) {
    if (!req.stream) throw ApiError(400, "\"stream_options\" needs \"stream\": true", "stream_options");
    if (!v->is_object()) bad("stream_options", "an object", *v);
    for (const auto& [k, x] : v->items()) {
      if (k != "include_usage" && k != "continuous_usage_stats") {
        throw ApiError(400, "unknown key \"" + k + "\" in \"stream_options\"", "stream_options");
      }
      if (!x.is_boolean()) bad("stream_options", "boolean values", *v);
    }
    req.include_usage = v->value("include_usage", false);
  }
  if (!chat) {
    if (const ordered_json* v = key_of(body, "echo")) {
      if (!v->is_boolean()) bad("echo", "true or false", *v);
      req.echo = v->get<bool>();
    }
  }
}

// The sampling keys (generate's --input keys under the API's names), max_tokens /
// max_completion_tokens (into `max_tokens`, the key given into `max_key`), and logprobs /
// top_logprobs (into req.logprobs): the settings every prompt of the request runs with.
RequestSettings read_sampling_keys(const ordered_json& body, bool chat, const ApiModel& model, ApiRequest& req,
                                   std::optional<int64_t>& max_tokens, const char*& max_key) {
  // The sampling keys are generate's --input keys; translate the API's names.
  ordered_json line = ordered_json::object();
  for (const char* k : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                        "frequency_penalty", "seed", "stop", "stop_token_ids"}) {
    if (const ordered_json* v = key_of(body, k)) line[k] = *v;
  }
  // top_k -1 means off in vLLM's API (0 in ours).
  if (line.contains("top_k") && line["top_k"].is_number_integer() && !line["top_k"].is_number_unsigned() &&
      line["top_k"].get<int64_t>() == -1) {
    line["top_k"] = 0;
  }
  for (const char* k : {"max_completion_tokens", "max_tokens"}) {
    if (!chat && std::string(k) == "max_completion_tokens") continue;
    if (const ordered_json* v = key_of(body, k)) {
      if (!is_count(*v)) bad(k, "an integer >= 0", *v);
      max_tokens = v->get<int64_t>();
      max_key = k;
      break;
    }
  }
  if (chat) {
    const ordered_json* lp = key_of(body, "logprobs");
    if (lp && !lp->is_boolean()) bad("logprobs", "true or false", *lp);
    const bool want = lp && lp->get<bool>();
    if (const ordered_json* t = key_of(body, "top_logprobs")) {
      if (!want) throw ApiError(400, "\"top_logprobs\" needs \"logprobs\": true", "top_logprobs");
      if (!is_count(*t) || t->get<int64_t>() > kMaxTopLogprobs) {
        bad("top_logprobs", "an integer in [0, " + std::to_string(kMaxTopLogprobs) + "]", *t);
      }
      req.logprobs = t->get<int64_t>();
    } else if (want) {
      req.logprobs = 0;
    }
  } else if (const ordered_json* lp = key_of(body, "logprobs")) {
    if (!is_count(*lp) || lp->get<int64_t>() > kMaxTopLogprobs) {
      bad("logprobs", "an integer in [0, " + std::to_string(kMaxTopLogprobs) + "]", *lp);
    }
    req.logprobs = lp->get<int64_t>();
  }
  if (req.logprobs >= 0) line["top_logprobs"] = req.logprobs;
  RequestSettings settings;
  try {
    settings = apply_request_keys(line, model.defaults, "request");
  } catch (const Error& e) {
    const std::string param = param_of(e, chat);
    throw ApiError(400, e.what(), param);
  }
  if (settings.sampling.top_k < 0) bad("top_k", "an integer >= 0, or -1 (off)", body["top_k"]);
  for (int64_t id : settings.stop_token_ids) {
    if (id >= model.vocab_size) bad("stop_token_ids", "ids < vocab_size = " + std::to_string(model.vocab_size), id);
  }
  req.seed = settings.seed;
  return settings;
}

// The prompts, text (tokenized) or token ids (decoded), into req.prompts: the chat
// messages rendered by the model's template, or "prompt" as a string, a list of strings,
// a list of ids or a list of lists of ids.
void read_prompts(const ordered_json& body, bool chat, const ApiModel& model, const ApiLimits& limits,
                  ApiRequest& req) {
  const Tokenizer& tok = *model.tokenizer;
  auto check_bytes = [&](const std::string& text, const char* param) {
    if (limits.prompt_byte_limit > 0 && static_cast<int64_t>(text.size()) > limits.prompt_byte_limit) {
      throw ApiError(400, "the prompt has " + std::to_string(text.size()) + " bytes, more than the context of " +
                              std::to_string(limits.max_seq_len) + " tokens can hold",
                     param);
    }
  };
  auto add_text = [&](const std::string& text, bool add_special) {
    check_bytes(text, chat ? "messages" : "prompt");
    Request r;
    r.text = text;
    try {
      r.ids = tok.encode(text, add_special);
    } catch (const Error& e) {
      throw ApiError(400, std::string("cannot tokenize the prompt: ") + e.what(), chat ? "messages" : "prompt");
    }
    req.prompts.push_back(std::move(r));
    req.prompt_given_as_text.push_back(true);
  };
  if (chat) {
    const ordered_json* messages = key_of(body, "messages");
    if (!messages) throw ApiError(400, "\"messages\" is required", "messages");
    // A rendered chat text already holds the template's BOS: no second one.
    add_text(render_chat(body, *messages, model, std::nullopt), false);
  } else {
    const ordered_json* prompt = key_of(body, "prompt");
    if (!prompt) throw ApiError(400, "\"prompt\" is required", "prompt");
    const char* expected = "a string, a list of strings, a list of token ids, or a list of lists of ids";
    auto ids_of = [&](const ordered_json& list) {
      std::vector<int32_t> ids;
      for (const auto& e : list) {
        if (!is_count(e) || e.get<int64_t>() >= model.vocab_size) {
          bad("prompt", "token ids in [0, " + std::to_string(model.vocab_size) + ")", e);
        }
        ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
      }
      if (static_cast<int64_t>(ids.size()) > limits.max_seq_len) {
        throw ApiError(400, "the prompt has " + std::to_string(ids.size()) + " tokens; this model's context is " +
                                std::to_string(limits.max_seq_len) + " tokens",
                       "prompt");
      }
      Request r;
      r.ids = std::move(ids);
      try {
        r.text = tok.decode(r.ids, /*skip_special_tokens=*/false);
      } catch (const Error& e) {
        throw ApiError(400, std::string("cannot decode the prompt ids: ") + e.what(), "prompt");
      }
      req.prompts.push_back(std::move(r));
      req.prompt_given_as_text.push_back(false);
    };
    if (prompt->is_string()) {
      add_text(prompt->get<std::string>(), true);
    } else if (prompt->is_array() && !prompt->empty()) {
      if ((*prompt)[0].is_string()) {
        for (const auto& p : *prompt) {
          if (!p.is_string()) bad("prompt", expected, *prompt);
          add_text(p.get<std::string>(), true);
          if (static_cast<int64_t>(req.prompts.size()) > limits.max_choices) break;
        }
      } else if ((*prompt)[0].is_array()) {
        for (const auto& p : *prompt) {
          if (!p.is_array()) bad("prompt", expected, *prompt);
          ids_of(p);
          if (static_cast<int64_t>(req.prompts.size()) > limits.max_choices) break;
        }
      } else if ((*prompt)[0].is_object()) {
        throw ApiError(400,
                       "\"prompt\" must be " + std::string(expected) + "; chat messages go to /v1/chat/completions "
                       "as \"messages\"",
                       "prompt");
      } else if (!(*prompt)[0].is_number()) {
        bad("prompt", expected, *prompt);
      } else {
        ids_of(*prompt);
      }
    } else {
      bad("prompt", expected, *prompt);
    }
  }
}

// Every prompt gets the settings and a max_new_tokens that fits the context: OpenAI's
// completions default to 16 new tokens, chat to whatever the context leaves; a
// max_tokens past the context is refused.
void fit_to_context(ApiRequest& req, const RequestSettings& settings, std::optional<int64_t> max_tokens,
                    const char* max_key, bool chat, const ApiLimits& limits) {
  if (static_cast<int64_t>(req.prompts.size()) * req.n > limits.max_choices) {
    throw ApiError(400, "at most " + std::to_string(limits.max_choices) + " choices (prompts x n) per request",
                   req.prompts.size() > 1 ? "prompt" : "n");
  }
  const char* prompt_param = chat ? "messages" : "prompt";
  for (Request& r : req.prompts) {
    const int64_t P = static_cast<int64_t>(r.ids.size());
    if (P == 0) throw ApiError(400, "the prompt has no tokens (and the tokenizer adds no BOS)", prompt_param);
    if (P > limits.max_seq_len) {
      throw ApiError(400, "this model's maximum context length is " + std::to_string(limits.max_seq_len) +
                              " tokens; the prompt has " + std::to_string(P),
                     prompt_param);
    }
    r.settings = settings;
    // OpenAI's completions default to 16 new tokens; chat to whatever the context leaves.
    r.settings.max_new_tokens = max_tokens ? *max_tokens : chat ? limits.max_seq_len - P : 16;
    if (r.settings.max_new_tokens > limits.max_seq_len - P) {  // (P + max_tokens could overflow)
      if (!max_tokens) {
        r.settings.max_new_tokens = limits.max_seq_len - P;
      } else {
        throw ApiError(400, "this model's maximum context length is " + std::to_string(limits.max_seq_len) +
                                " tokens; the prompt has " + std::to_string(P) + " and " + max_key + " asks for " +
                                std::to_string(*max_tokens),
                       max_key);
      }
    }
  }
}

}  // namespace

ApiRequest parse_api_request(const std::string& body_text, bool chat, const ApiModel& model, const ApiLimits& limits) {
  const ordered_json body = parse_body(body_text);
  check_keys(body, chat);
  ApiRequest req;
  req.chat = chat;
  check_model(body, model);
  read_response_keys(body, chat, limits, req);
  std::optional<int64_t> max_tokens;
  const char* max_key = "max_tokens";
  const RequestSettings settings = read_sampling_keys(body, chat, model, req, max_tokens, max_key);
  read_prompts(body, chat, model, limits, req);
  fit_to_context(req, settings, max_tokens, max_key, chat, limits);
  return req;
}

namespace {

// A body of /tokenize or /detokenize: a JSON object with only `known` keys, its "model"
// (when given) the one served.
ordered_json tool_body(const std::string& text, const ApiModel& model, std::initializer_list<const char*> known) {
  const ordered_json body = parse_body(text);
  for (const auto& [key, value] : body.items()) {
    if (std::find_if(known.begin(), known.end(), [&](const char* k) { return key == k; }) != known.end()) continue;
    std::string names;
    for (const char* k : known) names += std::string(names.empty() ? "" : ", ") + k;
    throw ApiError(400, "unknown key \"" + key + "\" (this endpoint takes: " + names + ")", key);
  }
  check_model(body, model);
  return body;
}

bool flag_of(const ordered_json& body, const char* key, bool fallback) {
  const ordered_json* v = key_of(body, key);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(key, "true or false", *v);
  return v->get<bool>();
}

}  // namespace

std::string tokenize_response(const std::string& text, const ApiModel& model, const ApiLimits& limits) {
  const ordered_json body =
      tool_body(text, model, {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                              "chat_template_kwargs", "return_token_strs"});
  const Tokenizer& tok = *model.tokenizer;
  const ordered_json* prompt = key_of(body, "prompt");
  const ordered_json* messages = key_of(body, "messages");
  if ((prompt != nullptr) == (messages != nullptr)) {
    throw ApiError(400, "give exactly one of \"prompt\" (a string) and \"messages\" (a chat)",
                   prompt ? "messages" : "prompt");
  }
  std::string input;
  const char* param = prompt ? "prompt" : "messages";
  if (prompt) {
    if (!prompt->is_string()) bad("prompt", "a string", *prompt);
    for (const char* k : {"add_generation_prompt", "chat_template_kwargs"}) {
      if (key_of(body, k)) throw ApiError(400, std::string("\"") + k + "\" goes with \"messages\"", k);
    }
    input = prompt->get<std::string>();
  } else {
    input = render_chat(body, *messages, model, flag_of(body, "add_generation_prompt", true));
  }
  // As generation refuses it: more text than the context can hold is not tokenized.
  if (limits.prompt_byte_limit > 0 && static_cast<int64_t>(input.size()) > limits.prompt_byte_limit) {
    throw ApiError(400, "the text has " + std::to_string(input.size()) + " bytes, more than the context of " +
                            std::to_string(limits.max_seq_len) + " tokens can hold",
                   param);
  }
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(input, flag_of(body, "add_special_tokens", prompt != nullptr));
  } catch (const Error& e) {
    throw ApiError(400, std::string("cannot tokenize: ") + e.what(), param);
  }
  ordered_json out;
  out["count"] = ids.size();
  out["max_model_len"] = limits.max_seq_len;
  out["tokens"] = ids;
  if (flag_of(body, "return_token_strs", false)) {
    ordered_json strs = ordered_json::array();
    for (int32_t id : ids) strs.push_back(tok.id_to_token(id));
    out["token_strs"] = std::move(strs);
  } else {
    out["token_strs"] = nullptr;
  }
  return dump_json(out);
}

std::string detokenize_response(const std::string& text, const ApiModel& model, const ApiLimits& limits) {
  const ordered_json body = tool_body(text, model, {"model", "tokens"});
  const ordered_json* tokens = key_of(body, "tokens");
  if (!tokens) throw ApiError(400, "\"tokens\" is required", "tokens");
  if (!tokens->is_array()) bad("tokens", "a list of token ids", *tokens);
  if (static_cast<int64_t>(tokens->size()) > limits.max_seq_len) {
    throw ApiError(400, "at most " + std::to_string(limits.max_seq_len) + " ids (the context), got " +
                            std::to_string(tokens->size()),
                   "tokens");
  }
  const int64_t vocab = std::min<int64_t>(model.vocab_size, model.tokenizer->vocab_size());
  std::vector<int32_t> ids;
  for (const auto& e : *tokens) {
    if (!is_count(e) || e.get<int64_t>() >= vocab) bad("tokens", "token ids in [0, " + std::to_string(vocab) + ")", e);
    ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  ordered_json out;
  try {
    out["prompt"] = model.tokenizer->decode(ids, /*skip_special_tokens=*/false);
  } catch (const Error& e) {
    throw ApiError(400, std::string("cannot decode the ids: ") + e.what(), "tokens");
  }
  return dump_json(out);
}

std::string api_token(const Tokenizer& tok, int32_t id) {
  std::string bytes;
  try {
    bytes = tok.token_bytes(id);
  } catch (const Error&) {
    return {};
  }
  if (utf8_valid_prefix(bytes) == bytes.size()) return bytes;
  std::string out = "bytes:";
  char hex[5];
  for (const unsigned char c : bytes) {
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += hex;
  }
  return out;
}

size_t utf8_chars(std::string_view text) {
  size_t n = 0;
  for (const char ch : text) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;  // not a continuation byte
  return n;
}

TextOffsets::TextOffsets(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids, bool echo, size_t prompt_chars)
    : tok_(tok), prompt_{StreamingDetokenizer(tok, {}), 0, {}}, completion_{StreamingDetokenizer(tok, prompt_ids), 0, {}},
      prompt_chars_(prompt_chars), base_(echo ? prompt_chars : 0) {}

size_t TextOffsets::Stream::next(const Tokenizer& tok, int32_t id) {
  const size_t at = chars + utf8_chars(std::string_view(held).substr(0, utf8_valid_prefix(held)));
  std::string out;
  try {
    out = detok.push(id);
  } catch (const Error&) {
    return at;  // an id the tokenizer cannot decode adds no text
  }
  if (!out.empty()) {
    chars += utf8_chars(out);
    held.clear();
  } else if (const std::optional<unsigned char> b = tok.fallback_byte(id)) {
    held += static_cast<char>(*b);
  }
  return at;
}

size_t TextOffsets::prompt(int32_t id) { return std::min({prompt_.next(tok_, id), prompt_chars_, cap_}); }

size_t TextOffsets::completion(int32_t id) { return std::min(base_ + completion_.next(tok_, id), cap_); }

ordered_json completion_logprobs(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                                 const std::vector<double>* prompt_logprobs,
                                 const std::vector<std::vector<std::pair<int32_t, float>>>* prompt_top,
                                 const std::vector<int32_t>& ids, const std::vector<TokenLogprobs>& lps, int64_t top_n,
                                 TextOffsets& text_offsets, const std::vector<size_t>* id_offsets) {
  ordered_json tokens = ordered_json::array(), token_lps = ordered_json::array(), tops = ordered_json::array(),
               offsets = ordered_json::array();
  size_t completion_index = 0;
  auto add = [&](int32_t id, std::optional<double> lp, const std::vector<std::pair<int32_t, float>>* top,
                 bool in_prompt) {
    const std::string text = api_token(tok, id);
    tokens.push_back(text);
    token_lps.push_back(lp ? ordered_json(*lp) : ordered_json());
    if (!lp) {
      tops.push_back(ordered_json());
    } else {
      ordered_json t = ordered_json::object();
      if (top) {
        for (const auto& [alt, alp] : *top) {
          if (static_cast<int64_t>(t.size()) >= top_n) break;
          t[api_token(tok, alt)] = alp;
        }
      }
      if (t.empty() || top_n > 0) t[text] = *lp;  // the chosen token is always listed
      tops.push_back(std::move(t));
    }
    if (in_prompt) {
      offsets.push_back(text_offsets.prompt(id));
    } else if (id_offsets) {
      offsets.push_back(completion_index < id_offsets->size() ? (*id_offsets)[completion_index] : 0);
      ++completion_index;
    } else {
      offsets.push_back(text_offsets.completion(id));
    }
  };
  if (prompt_logprobs) {
    for (size_t i = 0; i < prompt_ids.size(); ++i) {
      std::optional<double> lp;
      const std::vector<std::pair<int32_t, float>>* top = nullptr;
      if (i > 0 && i - 1 < prompt_logprobs->size()) lp = (*prompt_logprobs)[i - 1];
      if (i > 0 && prompt_top && i - 1 < prompt_top->size()) top = &(*prompt_top)[i - 1];
      add(prompt_ids[i], lp, top, true);
    }
  }
  for (size_t k = 0; k < ids.size() && k < lps.size(); ++k) add(ids[k], lps[k].logprob, &lps[k].top, false);
  ordered_json j;
  j["tokens"] = std::move(tokens);
  j["token_logprobs"] = std::move(token_lps);
  j["top_logprobs"] = std::move(tops);
  j["text_offset"] = std::move(offsets);
  return j;
}

ordered_json chat_logprobs(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::vector<TokenLogprobs>& lps,
                           int64_t top_n) {
  auto bytes_of = [](const std::string& s) {
    ordered_json b = ordered_json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  };
  auto raw_bytes = [&tok](int32_t id) {
    try {
      return tok.token_bytes(id);
    } catch (const Error&) {
      return std::string();
    }
  };
  ordered_json content = ordered_json::array();
  for (size_t k = 0; k < ids.size() && k < lps.size(); ++k) {
    ordered_json t;
    t["token"] = api_token(tok, ids[k]);
    t["logprob"] = lps[k].logprob;
    t["bytes"] = bytes_of(raw_bytes(ids[k]));
    ordered_json top = ordered_json::array();
    for (const auto& [alt, alp] : lps[k].top) {
      if (static_cast<int64_t>(top.size()) >= top_n) break;
      top.push_back({{"token", api_token(tok, alt)}, {"logprob", alp}, {"bytes", bytes_of(raw_bytes(alt))}});
    }
    t["top_logprobs"] = std::move(top);
    content.push_back(std::move(t));
  }
  return {{"content", content}};
}

ordered_json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  ordered_json u;
  u["prompt_tokens"] = prompt_tokens;
  u["completion_tokens"] = completion_tokens;
  u["total_tokens"] = prompt_tokens + completion_tokens;
  return u;
}

std::string dump_json(const ordered_json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string sse_frame(const ordered_json& j) { return "data: " + dump_json(j) + "\n\n"; }

}  // namespace linnet
