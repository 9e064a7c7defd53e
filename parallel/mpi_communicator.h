// MpiCommunicator: Communicator over an MPI communicator, host memory.
//
// Design choice: before each collective the ranks agree on its element count (one
// small MPI_Allreduce of {count, -count} under MAX). A rank whose shapes disagree
// makes every rank throw instead of leaving MPI to read past buffers or hang.
// LINNET_SKIP_COUNT_CHECK=1 turns the check off for benchmarking. Every collective is
// nonblocking underneath and waited for by GroupWatch (parallel/comm_watch.h): it
// sleeps rather than spins, and throws after --comm-timeout naming who is missing.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "parallel/comm_watch.h"
#include "parallel/communicator.h"
#include "parallel/tp_comm_choice.h"
#include "parallel/world_config.h"

namespace linnet {

/// Throws Error naming the MPI call, file:line and MPI's own error string when `call`
/// does not return MPI_SUCCESS.
#define LINNET_MPI_CHECK(call) ::linnet::detail::mpi_check((call), #call, __FILE__, __LINE__)

namespace detail {
void mpi_check(int rc, const char* expr, const char* file, int line);
}  // namespace detail

/// Communicator backed by an MPI communicator (duplicated, so collectives of linnet
/// never mix with the caller's). Errors from MPI are returned, not fatal, and rethrown
/// as Error.
class MpiCommunicator final : public Communicator {
 public:
  /// Duplicates `comm` and sets MPI_ERRORS_RETURN on the duplicate. Collective over
  /// `comm`. `name` names the group in timeout messages ("tp group", "world").
  explicit MpiCommunicator(MPI_Comm comm, std::string name = "group");
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float* data, std::size_t count) override;
  void all_reduce_sum(double* data, std::size_t count) override;
  void all_reduce_max(float* data, std::size_t count) override;
  void all_gather(const float* send, std::size_t count, float* recv) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void barrier() override;

  /// Runs one nonblocking MPI operation on comm() that `start` begins (it returns the
  /// MPI error code and fills the request) as a collective of this group: counted and
  /// waited for like the others, under --comm-timeout. `op` names it in errors.
  /// @throws Error when MPI fails or the wait times out (GroupWatch::wait).
  void collective(const char* op, const std::function<int(MPI_Request*)>& start);

  /// The groups of ranks with the same `color`, ordered by `key` (MPI_Comm_split);
  /// `name` names the new group in messages.
  std::unique_ptr<MpiCommunicator> split(int color, int key, std::string name = "group") const;
  MPI_Comm comm() const { return comm_; }

 private:
  void agree_on_count(std::size_t count, const char* op, int64_t number);
  void wait(MPI_Request& request, const char* op, int64_t number) { watch_.wait(request, op, number); }
  // In-place MPI_Iallreduce of `count` elements of `type` with `op`, watched as `name`.
  void all_reduce(void* data, std::size_t count, MPI_Datatype type, MPI_Op op, const char* name);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool check_counts_ = true;
  GroupWatch watch_;
};

/// The communicators of one process: the world, its tp group and its dp group.
struct MpiGroups {
  WorldConfig world_config;
  std::unique_ptr<MpiCommunicator> world;
  std::unique_ptr<MpiCommunicator> tp;  // tp_size contiguous ranks
  std::unique_ptr<MpiCommunicator> dp;  // the ranks with the same tp_rank
  /// Each world rank's device report (start_engine_run); empty when not gathered.
  std::vector<RankDevice> devices;
};

/// Builds WorldConfig and the group communicators from MPI_COMM_WORLD (MPI must be
/// initialized). local rank/size come from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED).
/// @throws Error as WorldConfig::make.
MpiGroups make_mpi_groups(int tp_size);

}  // namespace linnet
