// Chat templates: render a model's own Jinja `chat_template` (tokenizer_config.json or
// chat_template.jinja) into the prompt text, byte-identical to transformers'
// apply_chat_template(tokenize=False).
//
// Design choice: a small Jinja interpreter of our own (loader/chat/jinja*.cpp) instead of a
// library: Debian packages no C++ Jinja engine, and exact output needs Jinja2's
// whitespace rules and Python's value semantics, which the interpreter follows
// (transformers' environment: trim_blocks, lstrip_blocks, loopcontrols, its tojson,
// raise_exception, strftime_now). Constructs outside the subset chat templates use are
// refused when the template is parsed, with the line and the construct.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace linnet {

namespace jinja {
struct Node;
}

/// A parsed chat template. Immutable, cheap to copy, safe to render from several threads.
class ChatTemplate {
 public:
  /// Parses `source`. `name` (e.g. the file it came from) starts every error message.
  /// @throws Error "<name> line N: unsupported Jinja construct ..." or "syntax error ...",
  ///   or "... nests deeper than 256 levels" (jinja::kMaxNestingDepth).
  static ChatTemplate parse(std::string_view source, std::string name = "chat template");

  /// Renders with `variables` (a JSON object; each key becomes a template variable, JSON
  /// values map to Python's: object -> dict in key order, array -> list, null -> None).
  /// @throws Error "<name> line N: ..." on a runtime error, including the template's own
  ///   raise_exception("...") (its message is kept), and on passing a limit of
  ///   loader/chat/jinja.h (nesting, output size, evaluation steps, repetition, range());
  ///   Error "<name>: the rendered text is not valid UTF-8 ..." when the output is not.
  std::string render(const nlohmann::ordered_json& variables) const;

  const std::string& name() const { return *name_; }

 private:
  std::shared_ptr<const std::vector<jinja::Node>> nodes_;
  std::shared_ptr<const std::string> name_;
};

/// The special-token strings transformers passes to every template (its
/// special_tokens_map: only the ones the tokenizer has).
struct ChatSpecialTokens {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};

/// The variables of one chat request, as transformers' apply_chat_template passes them:
/// `request` is {"messages": [...], "add_generation_prompt": bool (default false),
/// "tools": [...] (default None), other keys (enable_thinking, date_string, ...) as extra
/// keyword arguments}; plus documents = None and the special tokens.
/// @throws Error naming `where` when "messages" is missing or not a list of objects, or
///   "add_generation_prompt" is not a boolean.
nlohmann::ordered_json chat_variables(const nlohmann::ordered_json& request, const ChatSpecialTokens& tokens,
                                      const std::string& where);

class Tokenizer;

/// A model's chat template with the special-token strings it is rendered with.
struct ModelChatTemplate {
  ChatTemplate chat_template;
  ChatSpecialTokens special_tokens;
};

/// The chat template of `tok` (loaded from `model_dir`: tokenizer_config.json's
/// chat_template, or chat_template.jinja), with the BOS / EOS strings of its config.
/// @throws Error naming model_dir/tokenizer_config.json when the model has no chat
///   template (e.g. a base model such as stories260k); Error naming the line when the
///   template uses an unsupported construct.
ModelChatTemplate load_chat_template(const Tokenizer& tok, const std::filesystem::path& model_dir);

}  // namespace linnet
