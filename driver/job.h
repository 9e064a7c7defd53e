// Job: the error protocol of a multi-rank run.
//
// Load phases touch no collective, so after one every rank can agree whether any rank
// failed (one MPI_Allreduce); then every rank exits non-zero together, and an error that
// every rank hit alike (a config field, a tensor shape) is printed once, by rank 0.
// In the run phase a failing rank prints its error prefixed "[rank r]" and calls
// MPI_Abort, so no rank is left waiting in a collective.
//
// Stopping on SIGINT/SIGTERM/SIGUSR1 is the other half of the protocol: the handler only
// sets a flag; RunRelay (driver/run_relay.h) passes it to every rank by a message (ranks
// of other dp groups share no collective with the signalled one until the run ends),
// and the step loops agree on it within their tp group once per step. SIGUSR1 is there
// because mpirun forwards it to every rank while it never forwards SIGINT/SIGTERM
// (docs/batch-runs.md, "Signals and mpirun").
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <mpi.h>

#include <memory>

#include "common/stop_signal.h"
#include "parallel/mpi_communicator.h"

namespace linnet {

/// Exit codes of linnet-tp (docs/batch-runs.md, "Exit codes"); every rank of a run exits with the same one.
inline constexpr int kOkExit = 0;            // every request / document done
inline constexpr int kLoadErrorExit = 1;     // a model, config or input file error, or a run-phase failure
inline constexpr int kUsageExit = 2;         // bad flags (parse errors, bad values, --tp not dividing the world)
inline constexpr int kSomeFailedExit = 3;    // some requests or documents failed, each marked in the output
inline constexpr int kInterruptedExit = 130; // stopped by SIGINT/SIGTERM/SIGUSR1 (128 + SIGINT, as shells report it)

/// The ranks of one linnet-tp run and how they fail together.
class Job {
 public:
  explicit Job(MPI_Comm world);
  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Runs `fn`, which must make no collective call, on every rank, then agrees on the
  /// outcome. Returns true when every rank succeeded; otherwise the error has been
  /// printed (once when all ranks failed, else by each failing rank) and the caller
  /// should return exit code 1. The agreement waits under --comm-timeout; when it times
  /// out (a rank stalled or died) the job is aborted with the message.
  bool load_phase(const std::function<void()>& fn);

  /// The exit code after a load_phase that failed, the same on every rank:
  /// kInterruptedExit when a rank failed because a stop signal ended its work (e.g. while
  /// reading --input), else kLoadErrorExit.
  int load_failure_exit() const { return load_failure_exit_; }

  /// Prints `message` as this rank's error and aborts the whole job (never returns).
  /// `cleanup` runs first (e.g. removing a temp file). A rank whose MPI_Abort does not end
  /// it within 5 s (mpirun unreachable) exits by itself with code 1.
  [[noreturn]] void abort(const std::string& message, const std::function<void()>& cleanup = {});

 private:
  MPI_Comm world_;
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<MpiCommunicator> agree_;  // the world, for load_phase's agreement
  int load_failure_exit_ = kLoadErrorExit;
};

/// Prints "linnet-tp: error: msg" (rank -1) or "[rank r] error: msg" to stderr.
void print_error(int rank, const std::string& message);

/// The dp x tp groups of a subcommand run with --tp `tp` (0: one tp group of all ranks):
/// checks the split on every rank first (make_mpi_groups is collective), then splits,
/// and prefixes log lines with the world rank when there are several ranks. Returns
/// nullopt, the error printed, when --tp cannot split this world (exit code 2).
std::optional<MpiGroups> make_run_groups(Job& job, int tp);

}  // namespace linnet
