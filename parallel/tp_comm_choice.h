// Which communicator a CUDA tp group uses for device buffers, decided from what every
// rank of the group reports about itself, so that every rank decides the same.
//
// Design choice: the decision is a pure function of the whole group's reports (each
// rank's GPU UUID, whether its build has NCCL, its LINNET_COMM), gathered once over the
// group (cuda_communicator's one all_gather). A per-rank guess (ranks on this node <=
// GPUs on this node) could mix NCCL on one rank with MPI on another when nodes hold
// different rank counts, and a hang follows; it also said "MPI" whenever a launcher gives
// each rank one GPU through CUDA_VISIBLE_DEVICES (Slurm's --gpus-per-task=1), where each
// rank sees a single device although no two ranks share one. The UUID tells both cases
// apart: NCCL refuses two ranks of a communicator on one GPU, and host-staged MPI serves
// them instead.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

namespace linnet {

/// The device-buffer communicator of a tp group.
enum class TpCommKind {
  kSelf,        ///< a group of one rank: nothing to exchange, no NCCL or MPI to start
  kNccl,        ///< NCCL on the compute stream, one GPU per rank
  kHostStaged,  ///< device -> pinned host -> MPI -> device (ranks sharing a GPU, no NCCL)
};

/// "self", "nccl" or "mpi (host-staged)".
const char* tp_comm_kind_name(TpCommKind kind);

/// What one rank reports for the choice. Fixed size and trivially copyable: it travels
/// as bytes in an all_gather.
struct TpCommReport {
  std::array<uint8_t, 16> gpu_uuid{};  ///< cudaDeviceProp::uuid of the rank's device
  uint8_t nccl_built = 0;              ///< 1 when this rank's build has NCCL
  /// LINNET_COMM of this rank: 0 unset, 1 "nccl", 2 "mpi".
  uint8_t wish = 0;
};

/// LINNET_COMM's value `value` (nullptr or "" when unset) as TpCommReport::wish.
/// @throws Error naming LINNET_COMM for anything but "", "nccl" and "mpi".
uint8_t parse_comm_wish(const char* value);

/// The decision and why, for the start-up line (`info`) and errors.
struct TpCommChoice {
  TpCommKind kind = TpCommKind::kSelf;
  std::string reason;
};

/// The communicator of a tp group whose rank i reported `ranks[i]` (group size >= 1):
/// - LINNET_COMM must be the same on every rank (else Error: mixing would hang);
/// - a group of one rank: kSelf, unless LINNET_COMM=nccl (then kNccl when built in);
/// - LINNET_COMM=mpi: kHostStaged;
/// - LINNET_COMM=nccl: kNccl; Error when a rank's build has no NCCL or two ranks share
///   a GPU (NCCL refuses that: "Duplicate GPU detected");
/// - unset: kNccl when every rank has NCCL and its own GPU, else kHostStaged with the
///   reason (the first two ranks that share a GPU, or the first rank without NCCL).
/// Every rank that calls it with the same reports gets the same result or the same
/// error. @throws Error naming LINNET_COMM as above.
TpCommChoice choose_tp_comm(std::span<const TpCommReport> ranks);

/// What one rank reports of its device at start-up (start_engine_run gathers one per
/// world rank, so no later step of loading needs a collective).
struct RankDevice {
  TpCommReport comm;         ///< for choose_tp_comm
  int64_t free_bytes = -1;   ///< cudaMemGetInfo of its GPU at start-up; -1 unknown / no GPU
  int64_t total_bytes = -1;
  uint8_t cuda = 0;          ///< 1 when the rank runs the CUDA backend on a visible device
  uint8_t ok = 1;            ///< 0 when the rank could not make its report (its error is its own)
};

/// How many entries of `uuids` (one per rank of a group) equal `uuids[me]`: the ranks
/// that share this rank's GPU, itself included (>= 1 for a valid `me`).
int ranks_on_same_gpu(std::span<const std::array<uint8_t, 16>> uuids, int me);

}  // namespace linnet
