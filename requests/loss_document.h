// One input line of `linnet-tp loss` as a document: its token ids and labels. Needs no
// model, engine or MPI (only the tokenizer for "text" lines), so the fuzz targets
// (tests/fuzz/) and unit tests link it alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace linnet {

class Tokenizer;

/// One document of `loss`.
struct LossDocument {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // unshifted, as transformers takes them; same length as ids; -100 = ignored
};

/// The document of one parsed line (parse_jsonl_line): {"text": ...} (tokenized by `tok`
/// with the special tokens it adds, e.g. BOS) or {"ids": [...]} with optional "labels"
/// of the same length (labels default to the ids). `vocab_size` is config.json's.
/// @throws Error naming `where` (file:line) when the line has a key other than text /
///   ids / labels, both or neither of text and ids, labels with text, a text that is not
///   a string or not valid UTF-8 (or no tokenizer for it), ids or labels that are not a
///   list of integers or differ in length, an id outside [0, vocab_size), a label
///   outside [0, vocab_size) other than -100.
LossDocument parse_loss_document(const nlohmann::ordered_json& line, const std::string& where, const Tokenizer* tok,
                                 int64_t vocab_size);

}  // namespace linnet
