#include "loader/json_brief.h"

#include <algorithm>
#include <set>
#include <stdexcept>
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

// A SAX handler that builds the document itself, refusing repeated keys. It appends
// each member of an ordered_json object to the object's vector directly: nlohmann's own
// parsers insert through ordered_map::operator[], which searches the object's keys
// first, so an object of n keys took O(n^2) (a line of a million keys, hours). The keys
// are unique by construction (`keys`), so nothing is lost by not searching.
template <class Json>
class UniqueKeysBuilder {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;

  UniqueKeysBuilder(Json& root, const std::string& where) : root_(root), where_(where) {}

  bool null() { return add(Json(nullptr)); }
  bool boolean(bool v) { return add(Json(v)); }
  bool number_integer(number_integer_t v) { return add(Json(v)); }
  bool number_unsigned(number_unsigned_t v) { return add(Json(v)); }
  bool number_float(number_float_t v, const string_t&) { return add(Json(v)); }
  bool string(string_t& v) { return add(Json(std::move(v))); }
  bool binary(binary_t& v) { return add(Json::binary(std::move(v))); }
  bool start_object(std::size_t) { return open(Json::value_t::object); }
  bool start_array(std::size_t) { return open(Json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& k) {
    Frame& top = stack_.back();
    if (!top.keys.insert(k).second) {
      std::string what = "duplicate key " + json_brief(nlohmann::json(k));
      if (objects_ > 1) what += " in " + json_brief(nlohmann::json(top.parent));
      throw Error(what + " (a JSON object may not repeat a key)", where_);
    }
    last_key_ = k;
    key_ = std::move(k);
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    if (const auto* p = dynamic_cast<const nlohmann::detail::parse_error*>(&e)) throw *p;
    if (const auto* o = dynamic_cast<const nlohmann::detail::out_of_range*>(&e)) throw *o;
    throw std::runtime_error(e.what());
  }

 private:
  struct Frame {
    Json* value;                 // the open array or object
    std::set<std::string> keys;  // an object's keys so far
    std::string parent;          // the key the object is the value of ("" at the top)
  };

  // Places `v` where the parse is (the root, the open array, or the open object's
  // current key) and returns it.
  Json* place(Json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& top = *stack_.back().value;
    if (top.is_array()) {
      auto& items = top.template get_ref<typename Json::array_t&>();
      items.push_back(std::move(v));
      return &items.back();
    }
    auto& members = top.template get_ref<typename Json::object_t&>();
    if constexpr (std::is_same_v<Json, nlohmann::ordered_json>) {
      auto& vec = static_cast<typename Json::object_t::Container&>(members);
      vec.emplace_back(std::move(key_), std::move(v));
      return &vec.back().second;
    } else {
      return &members.emplace(std::move(key_), std::move(v)).first->second;
    }
  }

  bool add(Json&& v) {
    place(std::move(v));
    return true;
  }

  bool open(typename Json::value_t type) {
    const bool object = type == Json::value_t::object;
    std::string parent = object && objects_ > 0 ? last_key_ : std::string();
    // The containers on the stack are always the last member of their parent, so these
    // pointers stay valid: a sibling is only appended once the container is closed.
    Json* value = place(Json(type));
    stack_.push_back({value, {}, std::move(parent)});
    if (object) ++objects_;
    return true;
  }

  bool close() {
    if (stack_.back().value->is_object()) --objects_;
    stack_.pop_back();
    return true;
  }

  Json& root_;
  const std::string& where_;
  std::vector<Frame> stack_;
  std::size_t objects_ = 0;  // objects on the stack
  string_t key_;             // the key whose value comes next
  std::string last_key_;     // the most recent key (names the object it opens)
};

template <class Json>
Json parse_unique_keys(std::string_view text, const std::string& where) {
  Json root;
  UniqueKeysBuilder<Json> builder(root, where);
  Json::sax_parse(text, &builder);
  return root;
}

}  // namespace

nlohmann::json parse_json_unique_keys(std::string_view text, const std::string& where) {
  return parse_unique_keys<nlohmann::json>(text, where);
}

nlohmann::ordered_json parse_ordered_json_unique_keys(std::string_view text, const std::string& where) {
  return parse_unique_keys<nlohmann::ordered_json>(text, where);
}

}  // namespace linnet
