// Jinja builtins: the filters, tests, str / dict methods and globals that chat templates
// use, with Jinja2's (jinja2/filters.py, tests.py) and Python's semantics, plus the
// globals transformers adds (raise_exception, strftime_now, namespace, dict) and its
// `tojson` (json.dumps with ensure_ascii=False; transformers/utils/chat_template_utils.py).
#include <algorithm>
#include <ctime>
#include <set>

#include "common/error.h"
#include "loader/chat/jinja.h"

namespace linnet::jinja {
namespace {

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// Python's str.strip / lstrip / rstrip; `chars` null: whitespace.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::u32string u = to_u32(s);
  const std::u32string set = chars && chars->is_string() ? to_u32(chars->s) : std::u32string();
  const bool ws = !chars || chars->is_none();
  const auto strip_it = [&](char32_t c) { return ws ? is_py_space(c) : set.find(c) != std::u32string::npos; };
  std::size_t b = 0, e = u.size();
  if (left) {
    while (b < e && strip_it(u[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(u[e - 1])) --e;
  }
  return from_u32(u.substr(b, e - b));
}

// Python's str.split(sep=None, maxsplit=-1).
List py_split(Evaluator& ev, const std::string& s, const Value* sep, int64_t maxsplit, int line) {
  List out;
  // Each item is a step; a string of 16 MiB could otherwise split into 16 million
  // empty strings (gigabytes of Values).
  const auto add = [&](std::string item) {
    if (out.size() >= kMaxListItems) {
      ev.fail(line, "the result of split() would have more than " + std::to_string(kMaxListItems) + " items");
    }
    ev.step(line);
    out.push_back(Value::string(std::move(item)));
  };
  if (!sep || sep->is_none()) {
    const std::u32string u = to_u32(s);
    std::size_t k = 0;
    while (k < u.size()) {
      while (k < u.size() && is_py_space(u[k])) ++k;
      if (k >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::size_t e = u.size();
        while (e > k && is_py_space(u[e - 1])) --e;
        add(from_u32(u.substr(k, e - k)));
        break;
      }
      std::size_t e = k;
      while (e < u.size() && !is_py_space(u[e])) ++e;
      add(from_u32(u.substr(k, e - k)));
      k = e;
    }
    return out;
  }
  if (!sep->is_string()) ev.fail(line, "split(): the separator must be a string");
  if (sep->s.empty()) ev.fail(line, "split(): empty separator");
  std::size_t at = 0;
  for (;;) {
    const std::size_t hit = find_text(s, sep->s, at);
    if (hit == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) {
      out.push_back(Value::string(s.substr(at)));
      return out;
    }
    add(s.substr(at, hit - at));
    at = hit + sep->s.size();
  }
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s) {
    if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  }
  return s;
}

std::string py_replace(Evaluator& ev, const std::string& s, const std::string& old, const std::string& with,
                       int64_t count, int line) {
  std::string out;
  std::size_t at = 0;
  int64_t done = 0;
  if (old.empty()) return s;
  for (std::size_t hit; (count < 0 || done < count) && (hit = find_text(s, old, at)) != std::string::npos; ++done) {
    ev.check_size(out.size() + (hit - at) + with.size(), line, "the result of replace()");
    out.append(s, at, hit - at);
    out += with;
    at = hit + old.size();
  }
  ev.check_size(out.size() + (s.size() - at), line, "the result of replace()");
  return out + s.substr(at);
}

// Positional argument k, else keyword `name`, else `def`.
const Value* arg(const Args& args, const Kwargs& kwargs, std::size_t k, const char* name, const Value* def = nullptr) {
  if (k < args.size()) return &args[k];
  for (const auto& [key, v] : kwargs) {
    if (key == name) return &v;
  }
  return def;
}

const Value& need_string(Evaluator& ev, const Value& v, const std::string& what, int line) {
  if (v.is_undefined()) ev.fail_undefined(line, v);
  if (!v.is_string()) ev.fail(line, what + " needs a string, got '" + v.type_name() + "'");
  return v;
}

int64_t need_int(Evaluator& ev, const Value& v, const std::string& what, int line) {
  if (v.type != Value::Type::kInt && v.type != Value::Type::kBool) ev.fail(line, what + " needs an integer, got '" + v.type_name() + "'");
  return v.type == Value::Type::kBool ? v.b : v.i;
}

Value str_method(Evaluator& ev, const std::string& s, const std::string& name, Args& args, Kwargs& kwargs, int line) {
  const std::string what = "str." + name + "()";
  if (name == "startswith" || name == "endswith") {
    const Value* p = arg(args, kwargs, 0, "prefix");
    if (!p) ev.fail(line, what + " needs an argument");
    if (p->type == Value::Type::kList) ev.step(line, static_cast<int64_t>(p->list->size()));
    List options = p->type == Value::Type::kList ? *p->list : List{*p};
    for (const Value& o : options) {
      const std::string& x = need_string(ev, o, what, line).s;
      const bool hit = name == "startswith" ? s.compare(0, x.size(), x) == 0 && s.size() >= x.size()
                                            : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
      if (hit) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return Value::string(py_strip(s, arg(args, kwargs, 0, "chars"), name != "rstrip", name != "lstrip"));
  }
  if (name == "split") {
    const Value* max = arg(args, kwargs, 1, "maxsplit");
    return Value::make_list(py_split(ev, s, arg(args, kwargs, 0, "sep"), max ? need_int(ev, *max, what, line) : -1, line));
  }
  if (name == "upper" || name == "lower") return Value::string(ascii_case(s, name == "upper"));
  if (name == "replace") {
    const Value* old = arg(args, kwargs, 0, "old");
    const Value* with = arg(args, kwargs, 1, "new");
    const Value* count = arg(args, kwargs, 2, "count");
    if (!old || !with) ev.fail(line, what + " needs two arguments");
    return Value::string(py_replace(ev, s, need_string(ev, *old, what, line).s, need_string(ev, *with, what, line).s,
                                    count ? need_int(ev, *count, what, line) : -1, line));
  }
  if (name == "find") {
    const Value* x = arg(args, kwargs, 0, "sub");
    if (!x) ev.fail(line, what + " needs an argument");
    const std::size_t hit = find_text(s, need_string(ev, *x, what, line).s);
    return Value::integer(hit == std::string::npos ? -1 : static_cast<int64_t>(to_u32(s.substr(0, hit)).size()));
  }
  if (name == "join") {
    const Value* x = arg(args, kwargs, 0, "iterable");
    if (!x) ev.fail(line, what + " needs an argument");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(ev, *x, line)) {
      const std::string& text = need_string(ev, item, what, line).s;
      ev.check_size(out.size() + (first ? 0 : s.size()) + text.size(), line, "the result of join()");
      if (!first) out += s;
      first = false;
      out += text;
    }
    return Value::string(std::move(out));
  }
  if (name == "title" || name == "capitalize") {
    std::string out = ascii_case(s, false);
    bool start = true;
    for (char& c : out) {
      if (start && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
      const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      start = name == "title" ? !alpha : false;
    }
    return Value::string(std::move(out));
  }
  ev.fail(line, "unsupported string method '" + name + "'");
}

const std::set<std::string>& str_methods() {
  static const std::set<std::string> k = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "upper",
                                          "lower", "replace", "find", "join", "title", "capitalize"};
  return k;
}

Value dict_method(Evaluator& ev, const Value& d, const std::string& name, Args& args, Kwargs& kwargs, int line) {
  if (name == "items" || name == "keys" || name == "values") {
    List out;
    for (const auto& [k, v] : *d.dict) {
      if (name == "items") {
        Value pair = Value::make_list({Value::string(k), v});
        pair.tuple = true;
        out.push_back(std::move(pair));
      } else {
        out.push_back(name == "keys" ? Value::string(k) : v);
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "get") {
    const Value* key = arg(args, kwargs, 0, "key");
    if (!key) ev.fail(line, "dict.get() needs a key");
    const Value none = Value::none();
    const Value* def = arg(args, kwargs, 1, "default", &none);
    if (key->is_string()) {
      if (const Value* v = d.find(key->s)) return *v;
    }
    return *def;
  }
  ev.fail(line, "unsupported dict method '" + name + "'");
}

}  // namespace

std::u32string to_u32(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : 0;
    if (n == 0 || i + n >= s.size()) {  // ASCII, or a stray byte kept as itself
      out += static_cast<char32_t>(c);
      ++i;
      continue;
    }
    char32_t cp = c & (0x3fu >> n);
    for (std::size_t k = 1; k <= n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3fu);
    out += cp;
    i += n + 1;
  }
  return out;
}

std::string from_u32(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  return out;
}

List iterate(Evaluator& ev, const Value& v, int line) {
  switch (v.type) {
    case Value::Type::kUndefined: return {};
    case Value::Type::kList:
      ev.step(line, static_cast<int64_t>(v.list->size()));
      ev.copied(list_bytes(*v.list), line);
      return *v.list;
    case Value::Type::kDict: {
      ev.step(line, static_cast<int64_t>(v.dict->size()));
      std::size_t bytes = 0;
      for (const auto& [k, e] : *v.dict) bytes += sizeof(Value) + k.size();
      ev.copied(bytes, line);
      List keys;
      for (const auto& [k, e] : *v.dict) keys.push_back(Value::string(k));
      return keys;
    }
    case Value::Type::kString: {
      const std::u32string u = to_u32(v.s);
      ev.step(line, static_cast<int64_t>(u.size()));
      ev.copied(u.size() * (sizeof(Value) + 4), line);
      List chars;
      for (char32_t c : u) chars.push_back(Value::string(from_u32(std::u32string(1, c))));
      return chars;
    }
    default: ev.fail(line, std::string("'") + v.type_name() + "' object is not iterable");
  }
}

std::size_t list_bytes(const List& items) {
  std::size_t bytes = 0;
  for (const Value& v : items) bytes += sizeof(Value) + v.s.size();
  return bytes;
}

int64_t length(Evaluator& ev, const Value& v, int line) {
  switch (v.type) {
    case Value::Type::kUndefined: return 0;
    case Value::Type::kString: return static_cast<int64_t>(to_u32(v.s).size());
    case Value::Type::kList: return static_cast<int64_t>(v.list->size());
    case Value::Type::kDict: return static_cast<int64_t>(v.dict->size());
    default: ev.fail(line, std::string("object of type '") + v.type_name() + "' has no len()");
  }
}

bool contains(Evaluator& ev, const Value& container, const Value& item, int line) {
  switch (container.type) {
    case Value::Type::kUndefined: return false;
    case Value::Type::kString:
      if (!item.is_string()) ev.fail(line, std::string("'in <string>' requires string as left operand, not ") + item.type_name());
      return find_text(container.s, item.s) != std::string::npos;
    case Value::Type::kList:
      return std::any_of(container.list->begin(), container.list->end(),
                         [&](const Value& e) { return equal(e, item, &ev, line); });
    case Value::Type::kDict:
    case Value::Type::kNamespace: return item.is_string() && container.find(item.s) != nullptr;
    default: ev.fail(line, std::string("argument of type '") + container.type_name() + "' is not iterable");
  }
}

Value get_method(const Value& obj, const std::string& name) {
  if (obj.is_string() && str_methods().count(name)) {
    const std::string s = obj.s;
    return Value::function([s, name](Evaluator& ev, Args& args, Kwargs& kwargs, int line) {
      return str_method(ev, s, name, args, kwargs, line);
    });
  }
  if (obj.type == Value::Type::kDict && (name == "items" || name == "keys" || name == "values" || name == "get")) {
    const Value d = obj;
    return Value::function([d, name](Evaluator& ev, Args& args, Kwargs& kwargs, int line) {
      return dict_method(ev, d, name, args, kwargs, line);
    });
  }
  return Value::undefined();
}

bool has_test(const std::string& test) {
  static const std::set<std::string> k = {
      "defined", "undefined", "none",  "boolean", "true",   "false", "integer", "float",   "number",      "string",
      "mapping", "iterable",  "sequence", "callable", "equalto", "eq", "==",    "ne",      "!=",          "lt",
      "<",       "le",        "<=",    "gt",      ">",      "ge",    ">=",      "in",      "odd",         "even",
      "divisibleby", "lower", "upper", "sameas"};
  return k.count(test) > 0;
}

bool apply_test(Evaluator& ev, const std::string& t, const Value& v, Args& args, int line) {
  using T = Value::Type;
  const auto need_arg = [&]() -> const Value& {
    if (args.empty()) ev.fail(line, "test '" + t + "' needs an argument");
    return args[0];
  };
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "boolean") return v.type == T::kBool;
  if (t == "true") return v.type == T::kBool && v.b;
  if (t == "false") return v.type == T::kBool && !v.b;
  if (t == "integer") return v.type == T::kInt;
  if (t == "float") return v.type == T::kFloat;
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "mapping") return v.type == T::kDict;
  if (t == "iterable") return v.type == T::kUndefined || v.is_string() || v.type == T::kList || v.type == T::kDict;
  if (t == "sequence") return v.type == T::kUndefined || v.is_string() || v.type == T::kList || v.type == T::kDict;
  if (t == "callable") return v.type == T::kFunction;
  if (t == "equalto" || t == "eq" || t == "==") return equal(v, need_arg(), &ev, line);
  if (t == "ne" || t == "!=") return !equal(v, need_arg(), &ev, line);
  if (t == "in") return contains(ev, need_arg(), v, line);
  if (t == "lt" || t == "<" || t == "le" || t == "<=" || t == "gt" || t == ">" || t == "ge" || t == ">=") {
    const Value& o = need_arg();
    if (!(v.is_number() && o.is_number()) && !(v.is_string() && o.is_string())) {
      ev.fail(line, "test '" + t + "' cannot compare '" + v.type_name() + "' and '" + o.type_name() + "'");
    }
    const auto num = [](const Value& x) {
      return x.type == T::kFloat ? x.f : static_cast<double>(x.type == T::kBool ? x.b : x.i);
    };
    const int c = v.is_string() ? v.s.compare(o.s) : num(v) < num(o) ? -1 : num(v) > num(o) ? 1 : 0;
    if (t == "lt" || t == "<") return c < 0;
    if (t == "le" || t == "<=") return c <= 0;
    if (t == "gt" || t == ">") return c > 0;
    return c >= 0;
  }
  if (t == "odd" || t == "even" || t == "divisibleby") {
    const int64_t x = need_int(ev, v, "test '" + t + "'", line);
    if (t == "divisibleby") {
      const int64_t d = need_int(ev, need_arg(), "test 'divisibleby'", line);
      if (d == 0) ev.fail(line, "division by zero");
      if (d == -1) return true;  // INT64_MIN % -1 traps on x86
      return x % d == 0;
    }
    return (x % 2 != 0) == (t == "odd");
  }
  if (t == "lower" || t == "upper") {
    if (!v.is_string()) return false;
    return ascii_case(v.s, t == "upper") == v.s;
  }
  if (t == "sameas") {
    const Value& o = need_arg();
    if (v.type != o.type) return false;
    if (v.type == T::kNone || v.type == T::kUndefined) return true;
    if (v.type == T::kBool) return v.b == o.b;
    if (v.type == T::kList) return v.list == o.list;
    if (v.type == T::kDict || v.type == T::kNamespace) return v.dict == o.dict;
    return equal(v, o, &ev, line);
  }
  ev.fail(line, "unsupported test '" + t + "'");
}

}  // namespace linnet::jinja
