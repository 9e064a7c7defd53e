// json_brief: guards for quoting and walking untrusted JSON. Loader errors quote the
// offending value from untrusted files; json::dump() recurses and prints without bound,
// so a hostile file nested millions of levels deep (or megabytes long) would crash or
// flood the message. The depth checks bound nesting before any recursive code (a
// component's Sequence, a json copy) walks a parsed value.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace linnet {

/// `v`'s JSON text when it is a primitive or a flat array/object of at most 16
/// primitives, else "<type> of <n> entries"; cut to 200 characters.
std::string json_brief(const nlohmann::json& v);

/// Checks that `v` nests at most `max_depth` arrays/objects (a primitive is depth 0,
/// [] and {} depth 1, [[1]] depth 2). Iterative, so it is safe on any parsed value.
/// @throws Error naming `where` and the limit when `v` is nested deeper.
void check_json_depth(const nlohmann::json& v, std::size_t max_depth, const std::string& where);

/// The same check on JSON text before it is parsed (a parse of megabytes of '[' costs
/// gigabytes): counts '[' and '{' outside strings, skipping escapes. Does not validate
/// the text otherwise.
/// @throws Error naming `where`, the limit and the byte offset when it nests deeper.
void check_json_text_depth(std::string_view text, std::size_t max_depth, const std::string& where);

/// json::parse / ordered_json::parse of untrusted text, refusing an object that repeats a
/// key (nlohmann keeps the last one silently, so `{"a": 1, "a": 2}` would hide the 1).
/// Duplicate keys are found while parsing, in objects at any depth. Linear in the number
/// of keys (nlohmann's ordered_json parser searches an object's keys for every insert).
/// @throws Error "duplicate key \"k\"" (with " in \"parent\"" for a nested object)
///   naming `where`; json::parse_error, unchanged, when the text is not valid JSON.
nlohmann::json parse_json_unique_keys(std::string_view text, const std::string& where);
nlohmann::ordered_json parse_ordered_json_unique_keys(std::string_view text, const std::string& where);

}  // namespace linnet
