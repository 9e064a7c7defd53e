#include "parallel/text_broadcast.h"

#include <cstdint>

namespace linnet {

void broadcast_strings(Communicator& comm, std::vector<std::string>& strings) {
  uint64_t count = strings.size();
  comm.broadcast(&count, sizeof count, 0);
  if (count == 0) {
    strings.clear();
    return;
  }
  std::vector<uint64_t> lengths(count);
  std::string bytes;
  if (comm.rank() == 0) {
    for (size_t i = 0; i < count; ++i) lengths[i] = strings[i].size();
    for (const auto& s : strings) bytes += s;
  }
  comm.broadcast(lengths.data(), lengths.size() * sizeof(uint64_t), 0);
  uint64_t total = 0;
  for (uint64_t n : lengths) total += n;
  bytes.resize(total);
  if (total > 0) comm.broadcast(bytes.data(), bytes.size(), 0);
  if (comm.rank() != 0) {
    strings.clear();
    uint64_t at = 0;
    for (uint64_t n : lengths) {
      strings.push_back(bytes.substr(at, n));
      at += n;
    }
  }
}

void broadcast_lines(Communicator& comm, std::vector<std::pair<int, std::string>>& lines) {
  std::vector<std::string> texts;
  std::vector<std::string> numbers;
  for (const auto& [n, t] : lines) {
    texts.push_back(t);
    numbers.push_back(std::to_string(n));
  }
  broadcast_strings(comm, texts);
  broadcast_strings(comm, numbers);
  lines.clear();
  for (size_t i = 0; i < texts.size(); ++i) lines.emplace_back(std::stoi(numbers[i]), std::move(texts[i]));
}

}  // namespace linnet
