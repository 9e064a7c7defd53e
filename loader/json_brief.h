// json_brief: a JSON value shortened for an error message. Loader errors quote the
// offending value from untrusted files; json::dump() recurses and prints without bound,
// so a hostile file nested millions of levels deep (or megabytes long) would crash or
// flood the message.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace linnet {

/// `v`'s JSON text when it is a primitive or a flat array/object of at most 16
/// primitives, else "<type> of <n> entries"; cut to 200 characters.
std::string json_brief(const nlohmann::json& v);

}  // namespace linnet
