// Chat templates: parse once (lexer -> parser), render per request (evaluator), and the
// variables transformers' apply_chat_template passes to a template.
#include "loader/chat/chat_template.h"

#include "common/error.h"
#include "loader/chat/jinja.h"
#include "loader/tokenizer/tokenizer.h"
#include "common/utf8.h"

namespace linnet {

ChatTemplate ChatTemplate::parse(std::string_view source, std::string name) {
  ChatTemplate t;
  t.name_ = std::make_shared<const std::string>(std::move(name));
  const std::vector<jinja::Token> tokens = jinja::lex(std::string(source), *t.name_);
  t.nodes_ = std::make_shared<const std::vector<jinja::Node>>(jinja::parse(tokens, *t.name_));
  return t;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  if (!nodes_) throw Error("render() of an empty ChatTemplate (use ChatTemplate::parse)", "chat template");
  if (!variables.is_object()) throw Error("the template variables must be a JSON object", *name_);
  std::string text = jinja::render(*nodes_, jinja::Value::from_json(variables), *name_);
  // Strings the template slices by byte (or the model's own text) can split a character;
  // refused here, naming the template, rather than by the JSON writer of the output line.
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t len = utf8_length_at(text, i);
    if (len == 0) {
      throw Error("the rendered text is not valid UTF-8 (invalid UTF-8 at byte offset " + std::to_string(i) + ")",
                  *name_);
    }
    i += len;
  }
  return text;
}

nlohmann::ordered_json chat_variables(const nlohmann::ordered_json& request, const ChatSpecialTokens& tokens,
                                      const std::string& where) {
  if (!request.is_object()) throw Error("a chat request must be a JSON object", where);
  const auto messages = request.find("messages");
  if (messages == request.end() || !messages->is_array()) {
    throw Error("a chat request needs \"messages\": a list of {\"role\", \"content\"} objects", where);
  }
  if (messages->empty()) {
    throw Error("cannot apply the chat template to an empty conversation; give at least one message", where);
  }
  // As transformers' apply_chat_template: keys whose value is null are dropped (APIs
  // send content=None, tool_calls=None), then reasoning given as "thinking" or
  // "reasoning" is also passed as "reasoning_content" (and "thinking", first).
  nlohmann::ordered_json normalized = nlohmann::ordered_json::array();
  for (const auto& m : *messages) {
    if (!m.is_object()) throw Error("each of \"messages\" must be a JSON object", where, "object", m.type_name());
    nlohmann::ordered_json msg = nlohmann::ordered_json::object();
    for (const auto& [key, value] : m.items()) {
      if (!value.is_null()) msg[key] = value;
    }
    for (const char* field : {"reasoning_content", "thinking", "reasoning"}) {
      if (!msg.contains(field)) continue;
      const nlohmann::ordered_json reasoning = msg[field];
      nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
      aliased["thinking"] = reasoning;
      for (const auto& [key, value] : msg.items()) aliased[key] = value;
      aliased["reasoning_content"] = reasoning;
      msg = std::move(aliased);
      break;
    }
    normalized.push_back(std::move(msg));
  }
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  // Order as in transformers: special tokens first, then the request's own keys override.
  if (tokens.bos_token) vars["bos_token"] = *tokens.bos_token;
  if (tokens.eos_token) vars["eos_token"] = *tokens.eos_token;
  vars["messages"] = normalized;
  vars["tools"] = nullptr;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = false;
  for (const auto& [key, value] : request.items()) {
    if (key == "add_generation_prompt" && !value.is_boolean()) {
      throw Error("\"add_generation_prompt\" must be true or false", where, "boolean", value.type_name());
    }
    if (key != "messages") vars[key] = value;  // messages: the normalized list above
  }
  return vars;
}

ModelChatTemplate load_chat_template(const Tokenizer& tok, const std::filesystem::path& model_dir) {
  const std::string config = (model_dir / "tokenizer_config.json").string();
  if (tok.chat_template().empty()) {
    throw Error("the model has no chat template, so chat messages cannot be turned into a prompt (a base model? "
                "give a raw --prompt instead)",
                config, "a \"chat_template\" in tokenizer_config.json or a chat_template.jinja beside it", "none");
  }
  ModelChatTemplate m{ChatTemplate::parse(tok.chat_template(), tok.chat_template_source()), {}};
  // The strings of the tokens (for added tokens the vocabulary string is the content).
  if (auto id = tok.bos_token_id()) m.special_tokens.bos_token = tok.id_to_token(*id);
  if (auto id = tok.eos_token_id()) m.special_tokens.eos_token = tok.id_to_token(*id);
  return m;
}

}  // namespace linnet
