// generation_config.json -> GenerationConfig. The file is optional and every field
// in it is optional; a field that is present must have the right JSON type (null
// counts as absent, as transformers writes it).
#include "loader/generation_config.h"

#include <algorithm>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
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

bool is_token_id(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

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
  if (const json* v = field_of(j, "temperature")) {
    if (!v->is_number()) type_error(source, "temperature", "a number", *v);
    g.temperature = v->get<double>();
  }
  if (const json* v = field_of(j, "top_k")) {
    if (!v->is_number_integer()) type_error(source, "top_k", "an integer", *v);
    g.top_k = v->get<int64_t>();
  }
  if (const json* v = field_of(j, "top_p")) {
    if (!v->is_number()) type_error(source, "top_p", "a number", *v);
    g.top_p = v->get<double>();
  }
  return g;
}

GenerationConfig GenerationConfig::load(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open generation config", path.string());
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw Error("generation config is not valid JSON", path.string(), "a JSON object", e.what());
  }
  return from_json(j, path.string());
}

}  // namespace linnet
