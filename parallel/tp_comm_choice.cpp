#include "parallel/tp_comm_choice.h"

#include <string>

#include "common/error.h"

namespace linnet {

const char* tp_comm_kind_name(TpCommKind kind) {
  switch (kind) {
    case TpCommKind::kSelf: return "self";
    case TpCommKind::kNccl: return "nccl";
    case TpCommKind::kHostStaged: return "mpi (host-staged)";
  }
  return "?";
}

uint8_t parse_comm_wish(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty()) return 0;
  if (v == "nccl") return 1;
  if (v == "mpi") return 2;
  throw Error("unknown value", "LINNET_COMM", "nccl or mpi (or unset)", v);
}

namespace {
const char* wish_text(uint8_t wish) { return wish == 1 ? "nccl" : wish == 2 ? "mpi" : "unset"; }
}  // namespace

TpCommChoice choose_tp_comm(std::span<const TpCommReport> ranks) {
  if (ranks.empty()) throw Error("a tp group has at least one rank", "choose_tp_comm");
  const uint8_t wish = ranks[0].wish;
  for (size_t i = 1; i < ranks.size(); ++i) {
    if (ranks[i].wish != wish) {
      throw Error("the ranks of a tp group disagree on LINNET_COMM (one communicator serves the whole group)",
                  "LINNET_COMM", "the same value on every rank",
                  std::string("rank 0: ") + wish_text(wish) + ", rank " + std::to_string(i) + ": " +
                      wish_text(ranks[i].wish));
    }
  }
  int no_nccl = -1;
  for (size_t i = 0; i < ranks.size() && no_nccl < 0; ++i) {
    if (!ranks[i].nccl_built) no_nccl = static_cast<int>(i);
  }
  int shared_a = -1, shared_b = -1;
  for (size_t i = 0; i < ranks.size() && shared_a < 0; ++i) {
    for (size_t j = i + 1; j < ranks.size(); ++j) {
      if (ranks[i].gpu_uuid == ranks[j].gpu_uuid) {
        shared_a = static_cast<int>(i);
        shared_b = static_cast<int>(j);
        break;
      }
    }
  }
  const std::string shared = shared_a < 0 ? "" : "ranks " + std::to_string(shared_a) + " and " +
                                                     std::to_string(shared_b) + " of the tp group share one GPU";
  const std::string unbuilt = no_nccl < 0 ? "" : "rank " + std::to_string(no_nccl) + "'s build has no NCCL";
  if (wish == 2) return {TpCommKind::kHostStaged, "LINNET_COMM=mpi"};
  if (wish == 1) {
    if (!unbuilt.empty()) throw Error(unbuilt, "LINNET_COMM=nccl", "a build with NCCL on every rank", "use LINNET_COMM=mpi");
    if (!shared.empty()) {
      throw Error(shared + "; NCCL needs one GPU per rank", "LINNET_COMM=nccl", "one GPU per rank",
                  "unset LINNET_COMM (host-staged MPI serves shared GPUs) or give each rank its own GPU");
    }
    return {TpCommKind::kNccl, "LINNET_COMM=nccl"};
  }
  if (ranks.size() == 1) return {TpCommKind::kSelf, "a tp group of one rank"};
  if (!unbuilt.empty()) return {TpCommKind::kHostStaged, unbuilt};
  if (!shared.empty()) return {TpCommKind::kHostStaged, shared + " (NCCL needs one GPU per rank)"};
  return {TpCommKind::kNccl, "one GPU per rank"};
}

int ranks_on_same_gpu(std::span<const std::array<uint8_t, 16>> uuids, int me) {
  if (me < 0 || static_cast<size_t>(me) >= uuids.size()) return 1;
  int n = 0;
  for (const auto& u : uuids) n += u == uuids[static_cast<size_t>(me)] ? 1 : 0;
  return n;
}

}  // namespace linnet
