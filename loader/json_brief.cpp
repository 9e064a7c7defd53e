#include "loader/json_brief.h"

#include <algorithm>
#include <set>
#include <type_traits>
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

// A SAX handler that builds the value as nlohmann's own DOM parser does, refusing a
// repeated key. Members are appended to an object without a lookup: ordered_json's
// operator[] searches the object's member list, so the DOM parsers (with or without a
// callback) take O(keys^2) on an object of many keys, seconds for a 1 MB body of
// distinct keys. Repeats are found with one std::set per open object: O(n log n).
template <class Json>
class UniqueKeyBuilder {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;

  UniqueKeyBuilder(Json& root, const std::string& where) : root_(root), where_(where) {}

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(number_integer_t v) { return put(v); }
  bool number_unsigned(number_unsigned_t v) { return put(v); }
  bool number_float(number_float_t v, const string_t& /*text*/) { return put(v); }
  bool string(string_t& v) { return put(v); }
  bool binary(binary_t& v) { return put(std::move(v)); }

  bool start_object(std::size_t /*elements*/) {
    Json* obj = place(Json(Json::value_t::object));
    stack_.push_back(obj);
    open_.push_back({{}, open_.empty() ? std::string() : last_key_});
    return true;
  }
  bool key(string_t& k) {
    last_key_ = k;
    if (!open_.back().keys.insert(k).second) {
      std::string what = "duplicate key " + json_brief(nlohmann::json(k));
      if (open_.size() > 1) what += " in " + json_brief(nlohmann::json(open_.back().parent));
      throw Error(what + " (a JSON object may not repeat a key)", where_);
    }
    auto& members = stack_.back()->template get_ref<typename Json::object_t&>();
    if constexpr (std::is_same_v<Json, nlohmann::ordered_json>) {
      // Appended: the key is new (checked above), so no search is needed.
      auto& list = static_cast<typename Json::object_t::Container&>(members);
      list.emplace_back(k, Json());
      member_ = &list.back().second;
    } else {
      member_ = &members[k];  // std::map: O(log n)
    }
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*elements*/) {
    stack_.push_back(place(Json(Json::value_t::array)));
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t /*position*/, const std::string& /*token*/, const Exception& ex) {
    throw ex;  // as Json::parse does: json::parse_error (or out_of_range), unchanged
  }

 private:
  template <class V>
  bool put(V&& v) {
    place(Json(std::forward<V>(v)));
    return true;
  }
  // Puts `v` where the next value goes: the root, the end of the open array, or the
  // member whose key came last.
  Json* place(Json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& top = *stack_.back();
    if (top.is_array()) {
      auto& items = top.template get_ref<typename Json::array_t&>();
      items.push_back(std::move(v));
      return &items.back();
    }
    *member_ = std::move(v);
    return member_;
  }

  struct Open {
    std::set<std::string> keys;
    std::string parent;
  };
  Json& root_;
  const std::string& where_;
  std::vector<Json*> stack_;  // open arrays and objects (their addresses hold while they are open)
  std::vector<Open> open_;
  Json* member_ = nullptr;
  std::string last_key_;
};

template <class Json>
Json parse_unique_keys(std::string_view text, const std::string& where) {
  Json result;
  UniqueKeyBuilder<Json> builder(result, where);
  Json::sax_parse(text, &builder);
  return result;
}

}  // namespace

nlohmann::json parse_json_unique_keys(std::string_view text, const std::string& where) {
  return parse_unique_keys<nlohmann::json>(text, where);
}

nlohmann::ordered_json parse_ordered_json_unique_keys(std::string_view text, const std::string& where) {
  return parse_unique_keys<nlohmann::ordered_json>(text, where);
}

}  // namespace linnet
