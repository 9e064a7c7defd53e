// WorldConfig: where this rank sits. world = dp x tp; a tp group is tp_size
// contiguous world ranks (ranks 0..tp-1 form group 0), so with the usual by-slot
// rank mapping a tp group stays inside one node and only data-parallel traffic
// crosses nodes.
#pragma once

namespace linnet {

/// Ranks and sizes of this process in the world, its tp group and its dp group.
struct WorldConfig {
  int world_rank = 0;
  int world_size = 1;
  int tp_rank = 0;     // index inside the tp group
  int tp_size = 1;
  int dp_rank = 0;     // which tp group this rank belongs to
  int dp_size = 1;
  int local_rank = 0;  // index among the ranks on this node
  int local_size = 1;  // ranks on this node

  /// Derives tp/dp coordinates. tp_size 0 means "all ranks in one tp group".
  /// @throws Error naming --tp when tp_size does not divide world_size.
  static WorldConfig make(int world_rank, int world_size, int tp_size, int local_rank,
                          int local_size);
};

}  // namespace linnet
