// One `loss` input line -> LossDocument (requests/loss_document.h).
#include "requests/loss_document.h"

#include "common/error.h"
#include "requests/jsonl_input.h"
#include "loader/tokenizer/tokenizer.h"
#include "runtime/loss.h"

namespace linnet {
namespace {

std::vector<int32_t> int_list(const nlohmann::ordered_json& v, const char* field, const std::string& where) {
  if (!v.is_array()) throw Error(std::string("\"") + field + "\" must be a list of integers", where);
  std::vector<int32_t> out;
  out.reserve(v.size());
  for (const auto& e : v) {
    if (!e.is_number_integer()) throw Error(std::string("\"") + field + "\" must be a list of integers", where);
    if ((e.is_number_unsigned() && e.get<uint64_t>() > INT32_MAX) ||
        (!e.is_number_unsigned() && (e.get<int64_t>() < INT32_MIN || e.get<int64_t>() > INT32_MAX))) {
      throw Error("integer out of range", where + ": " + field, "a token id or -100", e.dump());
    }
    out.push_back(e.get<int32_t>());
  }
  return out;
}

}  // namespace

LossDocument parse_loss_document(const nlohmann::ordered_json& line, const std::string& where, const Tokenizer* tok,
                                 int64_t vocab_size) {
  check_known_keys(line, {"text", "ids", "labels"}, "a loss line", where);
  LossDocument d;
  const auto text = line.find("text");
  const auto ids = line.find("ids");
  if ((text != line.end()) == (ids != line.end())) {
    throw Error("each line needs exactly one of \"text\" and \"ids\"", where);
  }
  if (text != line.end()) {
    if (!text->is_string()) throw Error("\"text\" must be a string", where);
    if (!tok) throw Error("\"text\" needs the model's tokenizer.json", where);
    try {
      d.ids = tok->encode(text->get<std::string>());
    } catch (const Error& e) {
      throw e.at(where);
    }
    if (line.contains("labels")) throw Error("\"labels\" go with \"ids\", not \"text\"", where);
  } else {
    d.ids = int_list(*ids, "ids", where);
  }
  for (size_t i = 0; i < d.ids.size(); ++i) {
    if (d.ids[i] < 0 || d.ids[i] >= vocab_size) {
      throw Error("token id out of range", where + ": ids[" + std::to_string(i) + "]",
                  "[0, " + std::to_string(vocab_size) + ")", std::to_string(d.ids[i]));
    }
  }
  if (const auto labels = line.find("labels"); labels != line.end()) {
    d.labels = int_list(*labels, "labels", where);
    if (d.labels.size() != d.ids.size()) {
      throw Error("\"labels\" and \"ids\" differ in length", where, std::to_string(d.ids.size()),
                  std::to_string(d.labels.size()));
    }
    for (size_t i = 0; i < d.labels.size(); ++i) {
      if (d.labels[i] != kIgnoreIndex && (d.labels[i] < 0 || d.labels[i] >= vocab_size)) {
        throw Error("label out of range", where + ": labels[" + std::to_string(i) + "]",
                    "[0, " + std::to_string(vocab_size) + ") or -100", std::to_string(d.labels[i]));
      }
    }
  } else {
    d.labels = d.ids;
  }
  return d;
}

}  // namespace linnet
