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
  if (const std::size_t valid = utf8_valid_prefix(text); valid < text.size()) {
    throw Error("the rendered text is not valid UTF-8 (invalid UTF-8 at byte offset " + std::to_string(valid) + ")",
                *name_);
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
  // Members are appended to the objects' vectors directly: ordered_json's operator[]
  // searches an object's keys before inserting, O(n^2) for a message or request of n
  // keys. The keys of a JSON object are unique, and the few that can meet one another
  // (the aliases below, the variables set before the request's own) are found by hand.
  using Members = nlohmann::ordered_json::object_t::Container;
  const auto members = [](nlohmann::ordered_json& obj) -> Members& {
    return static_cast<Members&>(obj.get_ref<nlohmann::ordered_json::object_t&>());
  };
  // Sets `key` in `obj`, searching only its first `search` members for it.
  const auto set = [&](nlohmann::ordered_json& obj, const std::string& key, nlohmann::ordered_json value,
                       std::size_t search) {
    Members& m = members(obj);
    for (std::size_t k = 0; k < search && k < m.size(); ++k) {
      if (m[k].first == key) {
        m[k].second = std::move(value);
        return;
      }
    }
    m.emplace_back(key, std::move(value));
  };
  // As transformers' apply_chat_template: keys whose value is null are dropped (APIs
  // send content=None, tool_calls=None), then reasoning given as "thinking" or
  // "reasoning" is also passed as "reasoning_content" (and "thinking", first).
  nlohmann::ordered_json normalized = nlohmann::ordered_json::array();
  for (const auto& m : *messages) {
    if (!m.is_object()) throw Error("each of \"messages\" must be a JSON object", where, "object", m.type_name());
    nlohmann::ordered_json msg = nlohmann::ordered_json::object();
    for (const auto& [key, value] : m.items()) {
      if (!value.is_null()) members(msg).emplace_back(key, value);
    }
    for (const char* field : {"reasoning_content", "thinking", "reasoning"}) {
      const auto found = msg.find(field);
      if (found == msg.end()) continue;
      const nlohmann::ordered_json reasoning = *found;
      nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
      members(aliased).emplace_back("thinking", reasoning);
      std::size_t reasoning_at = 0;  // where "reasoning_content" is, 0: not there
      for (const auto& [key, value] : msg.items()) {
        if (key == "thinking") {
          members(aliased)[0].second = value;
          continue;
        }
        if (key == "reasoning_content") reasoning_at = members(aliased).size();
        members(aliased).emplace_back(key, value);
      }
      if (reasoning_at != 0) {
        members(aliased)[reasoning_at].second = reasoning;
      } else {
        members(aliased).emplace_back("reasoning_content", reasoning);
      }
      msg = std::move(aliased);
      break;
    }
    normalized.push_back(std::move(msg));
  }
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  // Order as in transformers: special tokens first, then the request's own keys override.
  if (tokens.bos_token) set(vars, "bos_token", *tokens.bos_token, 0);
  if (tokens.eos_token) set(vars, "eos_token", *tokens.eos_token, 0);
  set(vars, "messages", std::move(normalized), 0);
  set(vars, "tools", nullptr, 0);
  set(vars, "documents", nullptr, 0);
  set(vars, "add_generation_prompt", false, 0);
  const std::size_t preset = vars.size();
  for (const auto& [key, value] : request.items()) {
    if (key == "add_generation_prompt" && !value.is_boolean()) {
      throw Error("\"add_generation_prompt\" must be true or false", where, "boolean", value.type_name());
    }
    if (key != "messages") set(vars, key, value, preset);  // messages: the normalized list above
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
