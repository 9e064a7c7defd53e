// Job: the error protocol of a multi-rank run.
//
// Load phases touch no collective, so after one every rank can agree whether any rank
// failed (one MPI_Allreduce); then every rank exits non-zero together, and an error that
// every rank hit alike (a config field, a tensor shape) is printed once, by rank 0.
// In the run phase a failing rank prints its error prefixed "[rank r]" and calls
// MPI_Abort, so no rank is left waiting in a collective.
#pragma once

#include <functional>
#include <string>

#include <mpi.h>

namespace linnet {

/// The ranks of one linnet-tp run and how they fail together.
class Job {
 public:
  explicit Job(MPI_Comm world);
  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Runs `fn`, which must make no collective call, on every rank, then agrees on the
  /// outcome. Returns true when every rank succeeded; otherwise the error has been
  /// printed (once when all ranks failed, else by each failing rank) and the caller
  /// should return exit code 1.
  bool load_phase(const std::function<void()>& fn);

  /// Prints `message` as this rank's error and aborts the whole job (never returns).
  /// `cleanup` runs first (e.g. removing a temp file).
  [[noreturn]] void abort(const std::string& message, const std::function<void()>& cleanup = {});

 private:
  MPI_Comm world_;
  int rank_ = 0;
  int size_ = 1;
};

/// Prints "linnet-tp: error: msg" (rank -1) or "[rank r] error: msg" to stderr.
void print_error(int rank, const std::string& message);

}  // namespace linnet
