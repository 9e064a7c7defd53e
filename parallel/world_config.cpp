#include "parallel/world_config.h"

#include <string>

#include "common/error.h"

namespace linnet {

WorldConfig WorldConfig::make(int world_rank, int world_size, int tp_size, int local_rank,
                              int local_size) {
  if (tp_size == 0) tp_size = world_size;
  if (tp_size < 1 || world_size % tp_size != 0) {
    throw Error("the tp size must divide the number of ranks", "--tp",
                "a divisor of " + std::to_string(world_size), std::to_string(tp_size));
  }
  WorldConfig w;
  w.world_rank = world_rank;
  w.world_size = world_size;
  w.tp_size = tp_size;
  w.tp_rank = world_rank % tp_size;
  w.dp_size = world_size / tp_size;
  w.dp_rank = world_rank / tp_size;
  w.local_rank = local_rank;
  w.local_size = local_size;
  return w;
}

}  // namespace linnet
