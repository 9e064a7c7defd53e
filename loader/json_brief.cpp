#include "loader/json_brief.h"

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "common/error.h"

namespace linnet {

std::string json_brief(const nlohmann::json& v) {
  std::string s;
  const bool flat = v.is_primitive() ||
                    (v.size() <= 16 && std::all_of(v.begin(), v.end(), [](const nlohmann::json& e) {
                       return e.is_primitive();
                     }));
  s = flat ? v.dump() : std::string(v.type_name()) + " of " + std::to_string(v.size()) + " entries";
  if (s.size() > 200) s = s.substr(0, 200) + "...";
  return s;
}

namespace {

[[noreturn]] void too_deep(std::size_t max_depth, const std::string& where, const std::string& at) {
  throw Error("JSON nested too deeply", where,
              "at most " + std::to_string(max_depth) + " levels of arrays/objects",
              "more than " + std::to_string(max_depth) + at);
}

}  // namespace

void check_json_depth(const nlohmann::json& v, std::size_t max_depth, const std::string& where) {
  if (!v.is_structured()) return;
  if (max_depth == 0) too_deep(max_depth, where, "");
  // One (next, end) pair per open container: the stack size is the current depth.
  using It = nlohmann::json::const_iterator;
  std::vector<std::pair<It, It>> stack;
  stack.emplace_back(v.cbegin(), v.cend());
  while (!stack.empty()) {
    auto& [next, end] = stack.back();
    if (next == end) {
      stack.pop_back();
      continue;
    }
    const nlohmann::json& child = *next;
    ++next;
    if (!child.is_structured()) continue;
    if (stack.size() >= max_depth) too_deep(max_depth, where, "");
    stack.emplace_back(child.cbegin(), child.cend());
  }
}

void check_json_text_depth(std::string_view text, std::size_t max_depth, const std::string& where) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) too_deep(max_depth, where, " at byte offset " + std::to_string(i));
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

namespace {

template <class Json>
Json parse_unique_keys(std::string_view text, const std::string& where) {
  // One entry per object being parsed: its keys so far, and the key it is the value of.
  struct Open {
    std::set<std::string> keys;
    std::string parent;
  };
  std::vector<Open> open;
  std::string last_key;
  const auto callback = [&](int /*depth*/, nlohmann::detail::parse_event_t event, Json& parsed) {
    using E = nlohmann::detail::parse_event_t;
    if (event == E::object_start) {
      open.push_back({{}, open.empty() ? std::string() : last_key});
    } else if (event == E::object_end) {
      open.pop_back();
    } else if (event == E::key) {
      last_key = parsed.template get<std::string>();
      if (!open.back().keys.insert(last_key).second) {
        std::string what = "duplicate key " + json_brief(nlohmann::json(last_key));
        if (open.size() > 1) what += " in " + json_brief(nlohmann::json(open.back().parent));
        throw Error(what + " (a JSON object may not repeat a key)", where);
      }
    }
    return true;
  };
  return Json::parse(text, callback);
}

}  // namespace

nlohmann::json parse_json_unique_keys(std::string_view text, const std::string& where) {
  return parse_unique_keys<nlohmann::json>(text, where);
}

nlohmann::ordered_json parse_ordered_json_unique_keys(std::string_view text, const std::string& where) {
  return parse_unique_keys<nlohmann::ordered_json>(text, where);
}

}  // namespace linnet
