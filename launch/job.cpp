#include "launch/job.h"

#include <cstdio>
#include <cstdlib>
#include <exception>

namespace linnet {

void print_error(int rank, const std::string& message) {
  std::string line = rank < 0 ? "linnet-tp: error: " : "[rank " + std::to_string(rank) + "] error: ";
  line += message + "\n";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

Job::Job(MPI_Comm world) : world_(world) {
  MPI_Comm_rank(world_, &rank_);
  MPI_Comm_size(world_, &size_);
}

bool Job::load_phase(const std::function<void()>& fn) {
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  int failed = error.empty() ? 0 : 1;
  int total = 0;
  MPI_Allreduce(&failed, &total, 1, MPI_INT, MPI_SUM, world_);
  if (total == 0) return true;
  if (failed) {
    if (total == size_) {
      if (rank_ == 0) print_error(-1, error);
    } else {
      print_error(rank_, error);
    }
  }
  return false;
}

void Job::abort(const std::string& message, const std::function<void()>& cleanup) {
  if (cleanup) cleanup();
  print_error(size_ > 1 ? rank_ : -1, message);
  if (size_ == 1) {  // nobody to wake: end quietly, without MPI_Abort's banner
    MPI_Finalize();
    std::exit(1);
  }
  MPI_Abort(world_, 1);
  std::abort();
}

}  // namespace linnet
