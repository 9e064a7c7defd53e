// Rank 0's strings to every rank of a communicator: the input lines and kept indices of
// `generate --input` and `loss`, which rank 0 alone reads (under mpirun stdin and local
// files exist only there). Collectives: every rank of `comm` calls them in the same order.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "parallel/communicator.h"

namespace linnet {

/// Copies rank 0's `strings` to every rank of `comm` (a collective).
void broadcast_strings(Communicator& comm, std::vector<std::string>& strings);

/// Copies rank 0's numbered lines to every rank of `comm` (a collective).
void broadcast_lines(Communicator& comm, std::vector<std::pair<int, std::string>>& lines);

}  // namespace linnet
