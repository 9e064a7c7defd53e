// generation_config.json -> GenerationConfig. The file is optional and every field
// in it is optional; a field that is present must have the right JSON type and a value
// the sampler accepts (null counts as absent, as transformers writes it).
#include "loader/generation_config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "loader/file_io.h"
#include "loader/json_brief.h"

namespace linnet {

namespace {

using nlohmann::json;

const json* field_of(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void type_error(const std::string& source, const char* field, const char* expected,
                             const json& v) {
  throw Error("wrong JSON type", source + ": field \"" + field + "\"", expected,
              std::string(v.type_name()) + " " + json_brief(v));
}

[[noreturn]] void value_error(const std::string& source, const char* field, const char* expected,
                              const json& v) {
  throw Error("impossible value", source + ": field \"" + field + "\"", expected, json_brief(v));
}

/// An integer that fits int64 (the parser keeps integers above 2^63-1 as unsigned).
bool is_int64(const json& v) {
  return v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                                : v.is_number_integer();
}

bool is_token_id(const json& v) { return is_int64(v) && v.get<int64_t>() >= 0; }

}  // namespace

GenerationConfig GenerationConfig::from_json(const json& j, const std::string& source) {
  if (!j.is_object())
    throw Error("generation config is not a JSON object", source, "object", j.type_name());
  GenerationConfig g;

  if (const json* v = field_of(j, "bos_token_id")) {
    if (!is_token_id(*v)) type_error(source, "bos_token_id", "a non-negative integer", *v);
    g.bos_token_id = v->get<int64_t>();
  }
  if (const json* v = field_of(j, "eos_token_id")) {
    if (is_token_id(*v)) {
      g.eos_token_ids.push_back(v->get<int64_t>());
    } else if (v->is_array()) {
      for (const json& e : *v) {
        if (!is_token_id(e))
          type_error(source, "eos_token_id", "a non-negative integer or a list of them", *v);
        g.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else {
      type_error(source, "eos_token_id", "a non-negative integer or a list of them", *v);
    }
  }
  if (const json* v = field_of(j, "do_sample")) {
    if (!v->is_boolean()) type_error(source, "do_sample", "true or false", *v);
    g.do_sample = v->get<bool>();
  }
  // The ranges the sampler accepts, checked here so the error names this file.
  if (const json* v = field_of(j, "temperature")) {
    if (!v->is_number()) type_error(source, "temperature", "a number", *v);
    const double t = v->get<double>();
    if (!std::isfinite(t) || t < 0) value_error(source, "temperature", "a finite number >= 0", *v);
    g.temperature = t;
  }
  if (const json* v = field_of(j, "top_k")) {
    if (!v->is_number_integer()) type_error(source, "top_k", "an integer", *v);
    if (!is_int64(*v) || v->get<int64_t>() < 0)
      value_error(source, "top_k", "an integer in [0, 2^63-1] (0: no top-k cut)", *v);
    g.top_k = v->get<int64_t>();
  }
  if (const json* v = field_of(j, "top_p")) {
    if (!v->is_number()) type_error(source, "top_p", "a number", *v);
    const double p = v->get<double>();
    if (!(p > 0 && p <= 1)) value_error(source, "top_p", "a number in (0, 1]", *v);
    g.top_p = p;
  }
  if (const json* v = field_of(j, "min_p")) {
    if (!v->is_number()) type_error(source, "min_p", "a number", *v);
    const double p = v->get<double>();
    if (!(p >= 0 && p <= 1)) value_error(source, "min_p", "a number in [0, 1]", *v);
    g.min_p = p;
  }
  if (const json* v = field_of(j, "repetition_penalty")) {
    if (!v->is_number()) type_error(source, "repetition_penalty", "a number", *v);
    const double p = v->get<double>();
    if (!std::isfinite(p) || !(p > 0)) value_error(source, "repetition_penalty", "a finite number > 0", *v);
    g.repetition_penalty = p;
  }
  if (const json* v = field_of(j, "max_new_tokens")) {
    if (!v->is_number_integer()) type_error(source, "max_new_tokens", "an integer", *v);
    if (!is_int64(*v) || v->get<int64_t>() < 0) value_error(source, "max_new_tokens", "an integer >= 0", *v);
    g.max_new_tokens = v->get<int64_t>();
  }
  return g;
}

GenerationConfig GenerationConfig::load(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  return from_text(read_text_file(path, "generation config"), path.string());
}

GenerationConfig GenerationConfig::from_text(std::string_view text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error("generation config is not valid JSON", source, "a JSON object", e.what());
  }
  return from_json(j, source);
}

}  // namespace linnet
