// Fuzz target: Jinja chat-template parse + render (loader/chat).
//
// Input: TEMPLATE [ '\0' VARIABLES ]. VARIABLES is JSON: a chat request ({"messages":
// [...], ...}, turned into variables by chat_variables as generate does) or any object
// of variables. Without it the template renders over a fixed conversation (system,
// user, assistant with a tool call, tool result) with tools and add_generation_prompt.
// An accepted render must be valid UTF-8 within jinja::kMaxOutputBytes; the bounds of
// loader/chat/jinja.h must keep every render inside libFuzzer's -timeout and
// -rss_limit_mb.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "loader/chat/chat_template.h"
#include "loader/chat/jinja.h"
#include "loader/json_brief.h"
#include "tests/fuzz/fuzz_util.h"

using namespace linnet;
using nlohmann::ordered_json;

namespace {

const ordered_json& default_variables() {
  static const ordered_json* vars = [] {
    const ordered_json request = ordered_json::parse(R"({
      "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris? naïve 🙂"},
        {"role": "assistant", "content": "", "reasoning_content": "call the tool",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "21 C."},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}]}
      ],
      "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
      "add_generation_prompt": true,
      "enable_thinking": false,
      "date_string": "26 Jul 2024"
    })");
    ChatSpecialTokens tokens;
    tokens.bos_token = "<s>";
    tokens.eos_token = "</s>";
    return new ordered_json(chat_variables(request, tokens, "fuzz request"));
  }();
  return *vars;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  default_variables();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::size_t cut = in.find('\0');
  const std::string_view source = in.substr(0, cut);
  ordered_json vars;
  try {
    if (cut == std::string_view::npos) {
      vars = default_variables();
    } else {
      const std::string_view text = in.substr(cut + 1);
      check_json_text_depth(text, 128, "fuzz variables");
      const ordered_json given = parse_ordered_json_unique_keys(text, "fuzz variables");
      if (given.is_object() && given.contains("messages")) {
        ChatSpecialTokens tokens;
        tokens.bos_token = "<s>";
        vars = chat_variables(given, tokens, "fuzz request");
      } else {
        vars = given;
      }
    }
  } catch (const nlohmann::json::exception&) {
    return 0;  // not JSON: nothing to render with
  } catch (const Error& e) {
    fuzz::refused(e);
    return 0;
  }
  try {
    const ChatTemplate t = ChatTemplate::parse(source, "fuzz.jinja");
    const std::string out = t.render(vars);
    if (!fuzz::valid_utf8(out)) fuzz::fail("render returned invalid UTF-8");
    if (out.size() > jinja::kMaxOutputBytes) fuzz::fail("render returned more than kMaxOutputBytes");
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  return 0;
}
