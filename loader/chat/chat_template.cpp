// Chat templates: parse once (lexer -> parser), render per request (evaluator), and the
// variables transformers' apply_chat_template passes to a template.
#include "loader/chat/chat_template.h"

#include <map>

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

namespace {

// An ordered_json object built key by key as operator[] would (a key set again keeps its
// place), in O(log n) per key: ordered_json's operator[] searches the member list, which
// made a request with many keys (chat_template_kwargs, a message) O(keys^2).
class ObjectBuilder {
 public:
  void set(const std::string& key, const nlohmann::ordered_json& value) {
    auto& list = static_cast<nlohmann::ordered_json::object_t::Container&>(
        object_.get_ref<nlohmann::ordered_json::object_t&>());
    const auto it = index_.find(key);
    if (it != index_.end()) {
      list[it->second].second = value;
    } else {
      index_.emplace(key, list.size());
      list.emplace_back(key, value);
    }
  }
  bool contains(const std::string& key) const { return index_.count(key) > 0; }
  const nlohmann::ordered_json& at(const std::string& key) const { return object_.at(key); }
  const nlohmann::ordered_json& value() const { return object_; }
  nlohmann::ordered_json take() { return std::move(object_); }

 private:
  nlohmann::ordered_json object_ = nlohmann::ordered_json::object();
  std::map<std::string, size_t> index_;
};

}  // namespace

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
    ObjectBuilder msg;
    for (const auto& [key, value] : m.items()) {
      if (!value.is_null()) msg.set(key, value);
    }
    for (const char* field : {"reasoning_content", "thinking", "reasoning"}) {
      if (!msg.contains(field)) continue;
      const nlohmann::ordered_json reasoning = msg.at(field);
      ObjectBuilder aliased;
      aliased.set("thinking", reasoning);
      for (const auto& [key, value] : msg.value().items()) aliased.set(key, value);
      aliased.set("reasoning_content", reasoning);
      msg = std::move(aliased);
      break;
    }
    normalized.push_back(msg.take());
  }
  ObjectBuilder vars;
  // Order as in transformers: special tokens first, then the request's own keys override.
  if (tokens.bos_token) vars.set("bos_token", *tokens.bos_token);
  if (tokens.eos_token) vars.set("eos_token", *tokens.eos_token);
  vars.set("messages", normalized);
  vars.set("tools", nullptr);
  vars.set("documents", nullptr);
  vars.set("add_generation_prompt", false);
  for (const auto& [key, value] : request.items()) {
    if (key == "add_generation_prompt" && !value.is_boolean()) {
      throw Error("\"add_generation_prompt\" must be true or false", where, "boolean", value.type_name());
    }
    if (key != "messages") vars.set(key, value);  // messages: the normalized list above
  }
  return vars.take();
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
