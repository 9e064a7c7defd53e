// CommWatch: how a rank waits for the others, and the watchdog of --comm-timeout.
//
// Open MPI's blocking collectives spin a core at 100% while they wait, and wait forever
// for a rank that stopped. Here each collective of MpiCommunicator (and each wait of the
// launcher) is started nonblocking and polled with MPI_Test: a short spin keeps a decode
// step's all_reduce latency, then sleeps of growing length (up to 1 ms) leave the core to
// the ranks that share it. A wait that has not completed after comm_timeout() seconds
// throws Error naming the ranks that have not arrived, and launch/ ends the job.
//
// Design choice: arrival is read from a table in node-shared memory
// (MPI_Win_allocate_shared) where every rank counts the collectives it has entered, per
// group. So the ranks of this host that have not arrived are named exactly, with their
// process state from /proc (stopped, exited); ranks on other hosts are listed as not
// known. Without init_comm_watch (unit tests) waits still time out but name no rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <mpi.h>

namespace linnet {

/// --comm-timeout's default, in seconds: torch's NCCL watchdog default (10 minutes).
inline constexpr double kDefaultCommTimeoutSeconds = 600;

/// Sets how long one wait for other ranks may last before it fails; 0 waits forever.
/// Every rank must set the same value (the flag is parsed alike everywhere).
void set_comm_timeout(double seconds);

/// The timeout of set_comm_timeout in seconds (kDefaultCommTimeoutSeconds until set; 0: none).
double comm_timeout();

/// Collective over `world` (MPI_COMM_WORLD, right after MPI_Init): shares every rank's
/// pid and host name and makes the node-shared arrival table. When the table cannot be
/// made (no shared memory), waits work the same but cannot name ranks.
void init_comm_watch(MPI_Comm world);

/// Collective over the world: frees the arrival table (before MPI_Finalize).
void finalize_comm_watch();

/// What is known of world rank `world_rank` now, for messages: "pid P on this host,
/// stopped (SIGSTOP or a debugger)", "on host H", or "" when init_comm_watch did not run.
std::string describe_rank(int world_rank);

/// Pauses of a poll loop: sched_yield for the first 10 ms (a spin on a core of its own,
/// which keeps a collective's latency; a runnable co-located rank gets the core), then
/// sleeps of 20 us doubling up to 1 ms, so a long wait costs about 1% of a core.
class PollBackoff {
 public:
  /// Call after a poll that found nothing to do.
  void pause();
  /// Call after a poll that made progress: the next pauses spin again.
  void reset() { polls_ = 0; sleep_us_ = 0; }

 private:
  std::chrono::steady_clock::time_point spin_start_;
  int64_t polls_ = 0;
  int64_t sleep_us_ = 0;
};

/// The time a wait has lasted, not counting time this process itself was stopped
/// (SIGSTOP, a debugger, a suspended machine): polls sleep at most 1 ms, so a gap of over
/// a second between two of them is left out. A rank that was stopped then does not blame
/// the others the moment it wakes.
class WaitClock {
 public:
  WaitClock() : start_(std::chrono::steady_clock::now()), last_(start_) {}
  /// Call once per poll: the seconds waited so far. `gap`, when given, receives the
  /// seconds left out at this call (0 when none).
  double seconds(double* gap = nullptr);

 private:
  std::chrono::steady_clock::time_point start_, last_;
};

/// The watch over one group's collectives: counts them in the arrival table and waits
/// for each with the timeout. One per MpiCommunicator.
class GroupWatch {
 public:
  /// A group that is not watched (no arrival table column, no names).
  GroupWatch() = default;
  /// Collective over `comm`: the members agree on a column of the arrival table.
  /// `name` names the group in messages ("tp group", "world").
  GroupWatch(MPI_Comm comm, std::string name);

  /// Counts the start of one collective of this group; returns its number (1, 2, ...).
  int64_t enter();

  /// Waits for `request`, a nonblocking operation on the group's communicator that is
  /// collective number `number` (from enter()), spinning briefly, then sleeping.
  /// @throws Error naming `op`, the group, the timeout and the ranks that have not
  ///   arrived, when it has not completed after comm_timeout() seconds; Error with MPI's
  ///   message when MPI_Test fails.
  void wait(MPI_Request& request, const char* op, int64_t number) const;

  /// The message wait() throws with: who of the group has not arrived at collective
  /// `number`, as far as the arrival table tells.
  std::string missing_ranks(int64_t number) const;

 private:
  std::string name_ = "group";
  int slot_ = -1;                 // column of the arrival table; -1: not watched
  int64_t entered_ = 0;           // collectives entered (also without a table)
  int rank_ = 0;                  // this rank in the group
  std::vector<int> world_ranks_;  // world rank of each group rank
};

}  // namespace linnet
