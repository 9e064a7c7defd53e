// The keys of one request line -> RequestSettings (requests/request_settings.h).
#include "requests/request_settings.h"

#include <cmath>

#include "common/error.h"

namespace linnet {
namespace {

using nlohmann::ordered_json;

std::string brief(const ordered_json& v) {
  std::string text = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

[[noreturn]] void bad_key(const std::string& where, const char* key, const std::string& expected,
                          const ordered_json& v) {
  throw Error("invalid value", where + ": key \"" + key + "\"", expected, brief(v));
}

bool is_int64(const ordered_json& v) {
  return v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX) : v.is_number_integer();
}

// The value of `key` in `line`, or null when absent or null.
const ordered_json* key_of(const ordered_json& line, const char* key) {
  const auto it = line.find(key);
  return it == line.end() || it->is_null() ? nullptr : &*it;
}

double number_key(const ordered_json& line, const char* key, const std::string& where, bool (*ok)(double),
                  const char* expected, double fallback) {
  const ordered_json* v = key_of(line, key);
  if (!v) return fallback;
  if (!v->is_number() || !ok(v->get<double>())) bad_key(where, key, expected, *v);
  return v->get<double>();
}

int64_t count_key(const ordered_json& line, const char* key, const std::string& where, int64_t max,
                  const std::string& expected, int64_t fallback) {
  const ordered_json* v = key_of(line, key);
  if (!v) return fallback;
  if (!is_int64(*v) || v->get<int64_t>() < 0 || v->get<int64_t>() > max) bad_key(where, key, expected, *v);
  return v->get<int64_t>();
}

}  // namespace

bool temperature_ok(double t) { return std::isfinite(t) && t >= 0.0; }
bool top_p_ok(double p) { return p > 0.0 && p <= 1.0; }
bool min_p_ok(double p) { return p >= 0.0 && p <= 1.0; }
bool penalty_ok(double p) { return std::isfinite(p) && p > 0.0; }
bool openai_penalty_ok(double p) { return p >= -2.0 && p <= 2.0; }

RequestSettings apply_request_keys(const ordered_json& line, RequestSettings s, const std::string& where) {
  SamplingParams& p = s.sampling;
  p.temperature = number_key(line, "temperature", where, temperature_ok, "a finite number >= 0", p.temperature);
  p.top_k = count_key(line, "top_k", where, INT64_MAX, "an integer >= 0 (0: off)", p.top_k);
  p.top_p = number_key(line, "top_p", where, top_p_ok, "a number in (0, 1]", p.top_p);
  p.min_p = number_key(line, "min_p", where, min_p_ok, "a number in [0, 1]", p.min_p);
  p.repetition_penalty = number_key(line, "repetition_penalty", where, penalty_ok, "a finite number > 0",
                                    p.repetition_penalty);
  p.presence_penalty = number_key(line, "presence_penalty", where, openai_penalty_ok, "a number in [-2, 2]",
                                  p.presence_penalty);
  p.frequency_penalty = number_key(line, "frequency_penalty", where, openai_penalty_ok, "a number in [-2, 2]",
                                   p.frequency_penalty);
  if (const ordered_json* v = key_of(line, "seed")) {
    if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<int64_t>() >= 0)) {
      bad_key(where, "seed", "an integer in [0, 2^64-1]", *v);
    }
    s.seed = v->get<uint64_t>();
  }
  s.max_new_tokens = count_key(line, "max_new_tokens", where, INT64_MAX, "an integer >= 0", s.max_new_tokens);
  if (const ordered_json* v = key_of(line, "stop")) {
    const char* expected = "a non-empty string or a list of them";
    std::vector<std::string> stop;
    if (v->is_string()) {
      stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const auto& e : *v) {
        if (!e.is_string()) bad_key(where, "stop", expected, *v);
        stop.push_back(e.get<std::string>());
      }
    } else {
      bad_key(where, "stop", expected, *v);
    }
    for (const auto& t : stop) {
      if (t.empty()) bad_key(where, "stop", expected, *v);
    }
    s.stop = std::move(stop);
  }
  if (const ordered_json* v = key_of(line, "stop_token_ids")) {
    const char* expected = "a list of token ids (integers >= 0)";
    if (!v->is_array()) bad_key(where, "stop_token_ids", expected, *v);
    std::vector<int64_t> ids;
    for (const auto& e : *v) {
      if (!is_int64(e) || e.get<int64_t>() < 0) bad_key(where, "stop_token_ids", expected, *v);
      ids.push_back(e.get<int64_t>());
    }
    s.stop_token_ids = std::move(ids);
  }
  if (const ordered_json* v = key_of(line, "logprobs")) {
    if (!v->is_boolean()) bad_key(where, "logprobs", "true or false", *v);
    if (!v->get<bool>()) {
      s.top_logprobs = -1;
    } else if (s.top_logprobs < 0) {
      s.top_logprobs = 0;
    }
  }
  if (key_of(line, "top_logprobs")) {
    s.top_logprobs = count_key(line, "top_logprobs", where, kMaxTopLogprobs,
                               "an integer in [0, " + std::to_string(kMaxTopLogprobs) + "]", 0);
  }
  return s;
}

}  // namespace linnet
