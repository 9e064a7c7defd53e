// Chat templates that attack the interpreter through the values they build rather than
// through the syntax (tests/fuzz/fuzz_chat_template.cpp found them): values nested
// 100000 levels deep, namespaces that hold themselves, list and string operations whose
// cost a step does not cover (`in`, `==`, slices, split(), substring search). Each
// must end in a bounded time and memory, without a crash or a leak, either rendered or
// as an Error naming the template and the line.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "loader/chat/chat_template.h"

// Allocations minus frees while `g_counting` is set: a render that leaks leaves it > 0.
namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_outstanding{0};
}  // namespace

void* operator new(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (!p) throw std::bad_alloc();
  if (g_counting.load(std::memory_order_relaxed)) g_outstanding.fetch_add(1, std::memory_order_relaxed);
  return p;
}
namespace {
void release(void* p) noexcept {
  if (p && g_counting.load(std::memory_order_relaxed)) g_outstanding.fetch_sub(1, std::memory_order_relaxed);
  std::free(p);
}
}  // namespace
void operator delete(void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }

namespace linnet {
namespace {

using ojson = nlohmann::ordered_json;

// Renders `source`; the output, or "error: <message>".
std::string render(const std::string& source) {
  try {
    return ChatTemplate::parse(source, "t.jinja").render(ojson::object());
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  }
}

// Allocations a parse + render of `source` leaves behind (0 unless it leaks).
long leaked_allocations(const std::string& source) {
  g_outstanding = 0;
  g_counting = true;
  {
    const std::string out = render(source);
  }
  g_counting = false;
  return g_outstanding.load();
}

const std::string kDeepList =
    "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}";

TEST(ChatLimits, ValuesNested100000DeepAreFreedWithoutRecursion) {
  // Destroying the value recursed once per level: a stack overflow (SIGSEGV).
  EXPECT_EQ(render(kDeepList + "{{ ns.l | length }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(d=dict()) %}{% for i in range(100000) %}{% set ns.d = dict(a=ns.d) %}"
                   "{% endfor %}ok"),
            "ok");
  // A chain through bound methods (each holds its dict) as well.
  EXPECT_EQ(render("{% set ns = namespace(d=dict()) %}{% for i in range(100000) %}{% set ns.d = dict(a=ns.d.get) %}"
                   "{% endfor %}ok"),
            "ok");
}

TEST(ChatLimits, ValuesNestedTooDeepToShowOrCompareAreAnError) {
  // As Python's RecursionError; two deep lists that are not the same object are compared item by item.
  const std::string two = kDeepList + "{% set ns.a = ns.l %}{% set ns.l = [] %}" +
                          "{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}";
  for (const char* use : {"{{ ns.l }}", "{{ ns.l | string }}", "{{ ns.l | tojson }}", "{{ ns.a == ns.l }}",
                                 "{{ ns.a in [ns.l] }}", "{{ 'x' ~ ns.l }}", "{{ ns }}"}) {
    SCOPED_TRACE(use);
    const std::string out = render(two + "\n" + std::string(use));
    EXPECT_EQ(out.rfind("error: t.jinja line 2: ", 0), 0u) << out.substr(0, 200);
    EXPECT_NE(out.find(" deeper than 512 levels"), std::string::npos) << out.substr(0, 200);
  }
  // The same object compares equal at once, as in Python (identity before ==).
  EXPECT_EQ(render(kDeepList + "{{ ns.l == ns.l }} {{ ns.l in [1, ns.l] }} {{ [ns.l] == [ns.l] }}"), "True True True");
  // Nesting real values reach is fine.
  EXPECT_EQ(render("{{ [[[[1]]]] }} {{ {'a': [{'b': 1}]} | tojson }} {{ [[1, [2]]] == [[1, [2]]] }}"),
            "[[[[1]]]] {\"a\": [{\"b\": 1}]} True");
}

TEST(ChatLimits, NamespacesThatHoldThemselvesDoNotLeak) {
  EXPECT_EQ(leaked_allocations("x"), 0);
  EXPECT_EQ(leaked_allocations("{% set ns = namespace(a=1) %}{{ ns.a }}"), 0);
  EXPECT_EQ(leaked_allocations("{% set ns = namespace() %}{% set ns.me = ns %}x"), 0);
  EXPECT_EQ(leaked_allocations("{% set ns = namespace() %}{% set ns.l = [1, ns] %}{{ ns }}"), 0);
  EXPECT_EQ(leaked_allocations("{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = b %}x"), 0);
  EXPECT_EQ(leaked_allocations("{% set ns = namespace() %}{% set ns.me = ns %}{{ raise_exception('no') }}"), 0);
}

TEST(ChatLimits, ListAndStringWorkIsCountedAsSteps) {
  // Each of these took minutes to hours: one step did O(list) or O(n * m) work.
  const std::string big = "{% set l = [0] * 1000000 %}{% set m = [0] * 1000000 %}";
  const std::vector<std::tuple<std::string, std::string>> cases = {
      {big + "{% for i in range(100000) %}\n{% if 5 in l %}{% endif %}{% endfor %}", "line 2"},
      {big + "{% for i in range(100000) %}\n{% if l == m %}{% endif %}{% endfor %}", "line 2"},
      {big + "{% for i in range(100000) %}\n{% if l is eq(m) %}{% endif %}{% endfor %}", "line 2"},
      {big + "{% for i in range(100000) %}\n{% set x = l[1:] %}{% endfor %}", "line 2"},
      {"{% set w = ['y'] * 1000000 %}{% for i in range(100000) %}\n{% if 'x'.startswith(w) %}{% endif %}{% endfor %}",
       "line 2"},
      // Shared structure: a list of 1000 references to a list of 1000000.
      {"{% set l = [[0] * 1000000] * 1000 %}{% set m = [[0] * 1000000] * 1000 %}\n{{ l == m }}", "line 2"},
  };
  for (const auto& [source, line] : cases) {
    SCOPED_TRACE(source.substr(0, 160));
    const auto start = std::chrono::steady_clock::now();
    const std::string out = render(source);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(out.rfind("error: t.jinja " + line + ": ", 0), 0u) << out.substr(0, 200);
    EXPECT_NE(out.find("evaluation steps"), std::string::npos) << out.substr(0, 200);
    EXPECT_LT(seconds, 20.0);
  }
}

TEST(ChatLimits, SubstringSearchTakesLinearTime) {
  // std::string::find compares the needle at every position: 8e6 x 8e6 byte compares.
  const std::string hay = "('a' * 16000000)";
  const std::string needle = "('a' * 8000000 ~ 'b')";
  for (const auto& [source, expected] : std::vector<std::pair<std::string, std::string>>{
           {"{{ " + needle + " in " + hay + " }}", "False"},
           {"{{ " + hay + ".find(" + needle + ") }}", "-1"},
           {"{{ " + hay + ".replace(" + needle + ", 'c') | length }}", "16000000"},
           {"{{ " + hay + ".split(" + needle + ") | length }}", "1"},
           {"{{ ('xx' ~ 'a' * 100 ~ 'b' ~ 'yy').find('a' * 100 ~ 'b') }}", "2"}}) {
    SCOPED_TRACE(source);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(render(source), expected);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
  }
}

TEST(ChatLimits, SplitIntoTooManyItemsIsAnError) {
  // 16 million empty strings took gigabytes.
  const std::string out = render("\n{{ ('a' * 16000000).split('a') | length }}");
  EXPECT_EQ(out.rfind("error: t.jinja line 2: ", 0), 0u) << out.substr(0, 200);
  EXPECT_NE(out.find("more than 1048576 items"), std::string::npos) << out.substr(0, 200);
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }}"), "['a', 'b', '', 'c'] ['a', 'b']");
}

// Seconds `f` takes.
template <class F>
double seconds_of(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(ChatLimits, ManyVariablesAndKeysTakeLinearTime) {
  // ordered_json's operator[] searches the keys before inserting (O(n^2) for n keys), and
  // every template variable was looked up by a scan of all of them.
  // (Built through the objects' vectors: operator[] here would be quadratic too.)
  const auto append = [](ojson& obj, std::string key, ojson value) {
    static_cast<ojson::object_t::Container&>(obj.get_ref<ojson::object_t&>()).emplace_back(std::move(key),
                                                                                           std::move(value));
  };
  ojson request = ojson::object();
  ojson message = {{"role", "user"}, {"content", "hi"}, {"thinking", "t"}};
  for (int k = 0; k < 200000; ++k) {
    const std::string n = std::to_string(k);
    append(request, std::string("v").append(n), k);
    append(message, std::string("m").append(n), k);
  }
  request["messages"] = ojson::array({message});
  ojson vars;
  EXPECT_LT(seconds_of([&] { vars = chat_variables(request, {}, "request"); }), 10.0);
  EXPECT_EQ(vars.size(), 4u + 200000u);  // messages, tools, documents, add_generation_prompt + the 200000
  const ojson& m = vars["messages"][0];
  EXPECT_EQ(m.begin().key(), "thinking");
  EXPECT_EQ(m.back(), "t");  // reasoning_content, last
  EXPECT_EQ(m.size(), 3u + 200000u + 1u);
  const ChatTemplate t = ChatTemplate::parse(
      "{% for i in range(100000) %}{% if absent is defined or v199999 != 199999 %}x{% endif %}{% endfor %}"
      "{{ messages[0].m5 }}",
      "t.jinja");
  std::string out;
  EXPECT_LT(seconds_of([&] { out = t.render(vars); }), 10.0);
  EXPECT_EQ(out, "5");
}

TEST(ChatLimits, MacroCallsDoNotCopyTheGlobals) {
  // Each call copied every top-level variable (here 16 MB) in and out again.
  std::string out;
  EXPECT_LT(seconds_of([&] {
              out = render("{% set s = 'a' * 16000000 %}{% macro f(x) %}{% if x == 19999 %}{{ x }}{% endif %}"
                           "{% endmacro %}{% for i in range(20000) %}{{ f(i) }}{% endfor %}");
            }),
            10.0);
  EXPECT_EQ(out, "19999");
  // A macro still sees the globals, not its caller's locals.
  EXPECT_EQ(render("{% set g = 1 %}{% macro f() %}{{ g }}{{ l is defined }}{% endmacro %}"
                   "{% for l in [1] %}{{ f() }}{% endfor %}{% set g = 2 %}{{ f() }}"),
            "1False2False");
}

}  // namespace
}  // namespace linnet
