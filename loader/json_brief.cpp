#include "loader/json_brief.h"

#include <algorithm>

namespace linnet {

std::string json_brief(const nlohmann::json& v) {
  std::string s;
  const bool flat = v.is_primitive() ||
                    (v.size() <= 16 && std::all_of(v.begin(), v.end(), [](const nlohmann::json& e) {
                       return e.is_primitive();
                     }));
  s = flat ? v.dump() : std::string(v.type_name()) + " of " + std::to_string(v.size()) + " entries";
  if (s.size() > 200) s = s.substr(0, 200) + "...";
  return s;
}

}  // namespace linnet
