// Jinja values with Python's semantics: str(), repr(), ==, truthiness, and json.dumps
// as transformers' `tojson` filter calls it (ensure_ascii=False by default).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "loader/chat/jinja.h"

namespace linnet::jinja {

namespace {

// Value destructors in progress on this thread, and what the ones nested deepest left to
// the outermost one (see ~Value).
constexpr int kMaxNestedDestructors = 32;
thread_local int t_destroying = 0;
thread_local std::vector<Value>* t_deferred = nullptr;

}  // namespace

Value::~Value() {
  if (!list && !dict && !fn) return;
  if (t_destroying >= kMaxNestedDestructors) {
    // Deep inside a nested value: hand what this one holds to the outermost destructor.
    Value rest;
    rest.list = std::move(list);
    rest.dict = std::move(dict);
    rest.fn = std::move(fn);
    t_deferred->push_back(std::move(rest));
    return;
  }
  const bool outermost = t_destroying == 0;
  std::vector<Value> deferred;
  if (outermost) t_deferred = &deferred;
  ++t_destroying;
  list.reset();
  dict.reset();
  fn.reset();
  if (outermost) {
    while (!deferred.empty()) {
      Value v = std::move(deferred.back());
      deferred.pop_back();
    }  // v's destructor runs here, one level deep, and may defer more
    t_deferred = nullptr;
  }
  --t_destroying;
}

Value Value::undefined(std::string name) {
  Value v;
  v.s = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.type = Type::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.type = Type::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.type = Type::kInt;
  v.i = x;
  return v;
}
Value Value::real(double x) {
  Value v;
  v.type = Type::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.type = Type::kString;
  v.s = std::move(x);
  return v;
}
Value Value::make_list(List items) {
  Value v;
  v.type = Type::kList;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::make_dict(Dict items) {
  Value v;
  v.type = Type::kDict;
  v.dict = std::make_shared<Dict>(std::move(items));
  return v;
}
Value Value::make_namespace(Dict items) {
  Value v = make_dict(std::move(items));
  v.type = Type::kNamespace;
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.type = Type::kFunction;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? real(static_cast<double>(u)) : integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(from_json(e));
      return make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (const auto& [k, e] : j.items()) items.emplace_back(k, from_json(e));
      return make_dict(std::move(items));
    }
    default: return none();
  }
}

bool Value::truthy() const {
  switch (type) {
    case Type::kUndefined:
    case Type::kNone: return false;
    case Type::kBool: return b;
    case Type::kInt: return i != 0;
    case Type::kFloat: return f != 0.0;
    case Type::kString: return !s.empty();
    case Type::kList: return !list->empty();
    case Type::kDict: return !dict->empty();
    default: return true;
  }
}

const Value* Value::find(const std::string& key) const {
  if (type != Type::kDict && type != Type::kNamespace) return nullptr;
  for (const auto& [k, v] : *dict) {
    if (k == key) return &v;
  }
  return nullptr;
}

const char* Value::type_name() const {
  switch (type) {
    case Type::kUndefined: return "Undefined";
    case Type::kNone: return "NoneType";
    case Type::kBool: return "bool";
    case Type::kInt: return "int";
    case Type::kFloat: return "float";
    case Type::kString: return "str";
    case Type::kList: return tuple ? "tuple" : "list";
    case Type::kDict: return "dict";
    case Type::kNamespace: return "Namespace";
    default: return "function";
  }
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // shortest round-trip digits: "-1.2345e+02"
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const std::size_t e_at = sci.find('e');
  std::string digits = sci.substr(0, e_at);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e_at + 1));
  // Python's repr: fixed notation for 1e-4 <= |d| < 1e16, else scientific.
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(static_cast<std::size_t>(exp + 1) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<std::size_t>(exp + 1)) + "." + digits.substr(static_cast<std::size_t>(exp + 1));
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out.append(digits, 1, std::string::npos);
  }
  char e[16];
  std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return sign + out + e;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

// Decodes one UTF-8 code point at s[i] (advancing i); invalid bytes map to themselves.
uint32_t next_code_point(const std::string& s, std::size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const std::size_t n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : 0;
  if (n == 0 || i + n >= s.size()) {
    ++i;
    return c;
  }
  uint32_t cp = c & (0x3fu >> n);
  for (std::size_t k = 1; k <= n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3fu);
  i += n + 1;
  return cp;
}

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      default: break;
    }
    if (c < 0x20) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      ++i;
    } else if (c < 0x80 || !ensure_ascii) {
      out += static_cast<char>(c);
      ++i;
    } else {
      uint32_t cp = next_code_point(s, i);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
    }
  }
  out += '"';
}

}  // namespace

namespace {

// repr() with Python's guard for containers that hold themselves (Py_ReprEnter): a list
// or dict already being shown prints as [...] / {...}. Only a namespace can close such
// a cycle (`{% set ns.me = ns %}`); without the guard it would recurse until the stack
// overflows. `active` is the path of containers being shown, so its length is the
// depth; the text goes into `out`, which may not pass kMaxOutputBytes (a list of a
// million references to one big list has a repr of terabytes).
void repr_into(const Value& v, std::vector<const void*>& active, std::string& out) {
  if (out.size() > kMaxOutputBytes) {
    throw ValueLimit("the text of a value would be longer than " + std::to_string(kMaxOutputBytes) + " bytes");
  }
  const auto enter = [&](const void* p) {
    if (std::find(active.begin(), active.end(), p) != active.end()) return false;
    if (active.size() >= static_cast<std::size_t>(kMaxValueDepth)) {
      throw ValueLimit("the value shown nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
    }
    active.push_back(p);
    return true;
  };
  switch (v.type) {
    case Value::Type::kString: out += repr_string(v.s); return;
    case Value::Type::kList: {
      if (!enter(v.list.get())) {
        out += v.tuple ? "(...)" : "[...]";
        return;
      }
      out += v.tuple ? "(" : "[";
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) out += ", ";
        repr_into((*v.list)[k], active, out);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      active.pop_back();
      out += v.tuple ? ")" : "]";
      return;
    }
    case Value::Type::kDict:
    case Value::Type::kNamespace: {
      const bool ns = v.type == Value::Type::kNamespace;
      if (!enter(v.dict.get())) {
        out += ns ? "<Namespace {...}>" : "{...}";
        return;
      }
      out += ns ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, e] : *v.dict) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k);
        out += ": ";
        repr_into(e, active, out);
      }
      active.pop_back();
      out += ns ? "}>" : "}";
      return;
    }
    default: out += to_str(v); return;
  }
}

}  // namespace

std::string to_repr(const Value& v) {
  std::vector<const void*> active;
  std::string out;
  repr_into(v, active, out);
  if (out.size() > kMaxOutputBytes) {
    throw ValueLimit("the text of a value would be longer than " + std::to_string(kMaxOutputBytes) + " bytes");
  }
  return out;
}

std::string to_str(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined: return "";
    case Value::Type::kNone: return "None";
    case Value::Type::kBool: return v.b ? "True" : "False";
    case Value::Type::kInt: return std::to_string(v.i);
    case Value::Type::kFloat: return float_repr(v.f);
    case Value::Type::kString: return v.s;
    case Value::Type::kFunction: return "<function>";
    default: return to_repr(v);
  }
}

namespace {

struct JsonWriter {
  bool ensure_ascii;
  int indent;
  const std::string& item_sep;
  const std::string& key_sep;
  bool sort_keys;
  std::string& out;
  bool too_long = false;  // out would pass kMaxOutputBytes: writing stopped

  void newline(int level) {
    if (indent < 0) return;
    const std::size_t pad = static_cast<std::size_t>(indent) * static_cast<std::size_t>(level);
    if (out.size() + 1 + pad > kMaxOutputBytes) {
      too_long = true;
      return;
    }
    out += '\n';
    out.append(pad, ' ');
  }

  bool write(const Value& x, int level) {
    if (too_long || out.size() > kMaxOutputBytes) {
      too_long = true;
      return false;
    }
    if (level >= kMaxValueDepth && (x.type == Value::Type::kList || x.type == Value::Type::kDict)) {
      throw ValueLimit("the value given to tojson nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
    }
    switch (x.type) {
      case Value::Type::kNone: out += "null"; return true;
      case Value::Type::kBool: out += x.b ? "true" : "false"; return true;
      case Value::Type::kInt: out += std::to_string(x.i); return true;
      case Value::Type::kFloat:
        out += std::isnan(x.f) ? "NaN" : std::isinf(x.f) ? (x.f < 0 ? "-Infinity" : "Infinity") : float_repr(x.f);
        return true;
      case Value::Type::kString: json_string(x.s, ensure_ascii, out); return true;
      case Value::Type::kList: {
        if (x.list->empty()) {
          out += "[]";
          return true;
        }
        out += '[';
        for (std::size_t k = 0; k < x.list->size(); ++k) {
          if (k > 0) out += item_sep;
          newline(level + 1);
          if (!write((*x.list)[k], level + 1)) return false;
        }
        newline(level);
        out += ']';
        return true;
      }
      case Value::Type::kDict: {
        if (x.dict->empty()) {
          out += "{}";
          return true;
        }
        std::vector<const std::pair<std::string, Value>*> entries;
        for (const auto& e : *x.dict) entries.push_back(&e);
        if (sort_keys) {
          std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
        }
        out += '{';
        for (std::size_t k = 0; k < entries.size(); ++k) {
          if (k > 0) out += item_sep;
          newline(level + 1);
          json_string(entries[k]->first, ensure_ascii, out);
          out += key_sep;
          if (!write(entries[k]->second, level + 1)) return false;
        }
        newline(level);
        out += '}';
        return true;
      }
      default: return false;
    }
  }
};

}  // namespace

bool to_json(const Value& v, bool ensure_ascii, int indent, const std::string& item_sep, const std::string& key_sep,
             bool sort_keys, std::string& out, bool* too_long) {
  JsonWriter w{ensure_ascii, indent, item_sep, key_sep, sort_keys, out};
  const bool ok = w.write(v, 0);
  w.too_long = w.too_long || out.size() > kMaxOutputBytes;
  if (too_long) *too_long = w.too_long;
  return ok && !w.too_long;
}

namespace {

bool equal_at(const Value& a, const Value& b, Evaluator* ev, int line, int depth) {
  using T = Value::Type;
  if (ev) ev->step(line);
  if (a.is_number() && b.is_number()) {
    if (a.type == T::kFloat || b.type == T::kFloat) {
      const double x = a.type == T::kFloat ? a.f : static_cast<double>(a.type == T::kBool ? a.b : a.i);
      const double y = b.type == T::kFloat ? b.f : static_cast<double>(b.type == T::kBool ? b.b : b.i);
      return x == y;
    }
    return (a.type == T::kBool ? a.b : a.i) == (b.type == T::kBool ? b.b : b.i);
  }
  if (a.type != b.type) return false;
  if ((a.type == T::kList && a.list == b.list) || (a.type == T::kDict && a.dict == b.dict)) return true;
  if ((a.type == T::kList || a.type == T::kDict) && depth >= kMaxValueDepth) {
    throw ValueLimit("the values compared nest deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
  switch (a.type) {
    case T::kUndefined:
    case T::kNone: return true;
    case T::kString: return a.s == b.s;
    case T::kList:
      if (a.list->size() != b.list->size()) return false;
      for (std::size_t k = 0; k < a.list->size(); ++k) {
        if (!equal_at((*a.list)[k], (*b.list)[k], ev, line, depth + 1)) return false;
      }
      return true;
    case T::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, e] : *a.dict) {
        const Value* o = b.find(k);
        if (!o || !equal_at(e, *o, ev, line, depth + 1)) return false;
      }
      return true;
    default: return a.dict == b.dict && a.fn == b.fn;
  }
}

}  // namespace

bool equal(const Value& a, const Value& b, Evaluator* ev, int line) { return equal_at(a, b, ev, line, 0); }

std::size_t find_text(std::string_view haystack, std::string_view needle, std::size_t from) {
  if (from > haystack.size()) return std::string_view::npos;
  if (needle.empty()) return from;
  // glibc's memmem is the two-way algorithm: linear time for any needle.
  const void* hit = ::memmem(haystack.data() + from, haystack.size() - from, needle.data(), needle.size());
  return hit ? static_cast<std::size_t>(static_cast<const char*>(hit) - haystack.data()) : std::string_view::npos;
}

}  // namespace linnet::jinja
