// The rank's CPU threads: one OpenMP team per rank, sized and pinned to the rank's share
// of the node's cores. Under mpirun, Open MPI binds a rank to one core by default (np
// <= 2) or to a socket; a rank that then starts T threads would run them all on that
// one core. So each rank sets its own placement: the node's C cores split evenly over
// its L ranks, local rank r owning cores [r*C/L, (r+1)*C/L), and OpenMP thread t of the
// rank pinned to core t of that share (round robin when T exceeds it). LINNET_PIN=0
// leaves placement to the launcher (mpirun --bind-to ..., OMP_PROC_BIND, taskset).
// Launch with `mpirun --bind-to none`: libgomp reads the process's cores once, at
// start-up, and when it then has more threads than it saw (Open MPI bound the rank to
// one core) it parks idle threads on futexes instead of spinning, so every parallel
// region pays a wake-up (measured: decode of the 135M shape 32-40 tok/s bound vs 43-62
// with --bind-to none). pin_threads reports it (Placement::launcher_warning).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace linnet::cpu {

/// Sets the rank's kernel thread count (OpenMP). n < 1 means 1.
void set_num_threads(int n);
/// The rank's kernel thread count.
int num_threads();

/// Threads an element-wise op over `work` elements uses: 1 below 2^15 elements (a fork
/// and join of the team costs about as much as that work), else num_threads(). Every op
/// that uses it splits whole rows or fixed column chunks, never a sum, so its result
/// does not depend on the count.
int threads_for(int64_t work);

/// The cores local rank `local_rank` of `local_size` owns on a node of `cores` cores:
/// [local_rank * cores / local_size, (local_rank + 1) * cores / local_size), at least
/// one core (ranks share cores round robin when there are more ranks than cores).
std::vector<int> core_share(int local_rank, int local_size, int cores);

/// What pin_threads did, for the start-up log.
struct Placement {
  std::string where;             // "cores 0-1", "not pinned (LINNET_PIN=0)", or why pinning failed
  std::string launcher_warning;  // non-empty when the launcher had bound the rank to fewer cores
                                 // than its threads (see the file comment): what to change
};

/// Pins this process and its OpenMP threads to core_share(local_rank, local_size,
/// online cores), thread t on core t of the share, unless LINNET_PIN=0. Never throws.
Placement pin_threads(int local_rank, int local_size);

}  // namespace linnet::cpu
