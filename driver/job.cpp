#include "driver/job.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include "common/log.h"

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
  agree_ = std::make_unique<MpiCommunicator>(world_, "world");
}

bool Job::load_phase(const std::function<void()>& fn) {
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  const int failed = error.empty() ? 0 : 1;
  // exact: counts of ranks; [1]: failed ranks that had caught a stop signal
  float sums[2] = {static_cast<float>(failed), static_cast<float>(failed && caught_stop_signal() != 0)};
  try {
    agree_->all_reduce_sum(sums, 2);
  } catch (const std::exception& e) {  // a rank stalled or died while loading
    abort(error.empty() ? std::string(e.what()) : error + "; then " + e.what());
  }
  const int total = static_cast<int>(sums[0]);
  load_failure_exit_ = sums[1] > 0 ? kInterruptedExit : kLoadErrorExit;
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
    std::exit(kLoadErrorExit);
  }
  // MPI_Abort asks mpirun to end the job; a rank cut off from it (a lost link) would wait
  // for that forever, so it ends itself a few seconds later.
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::_Exit(kLoadErrorExit);
  }).detach();
  MPI_Abort(world_, kLoadErrorExit);
  std::abort();
}

std::optional<MpiGroups> make_run_groups(Job& job, int tp) {
  if (!job.load_phase([&] { WorldConfig::make(job.rank(), job.size(), tp, 0, 1); })) return std::nullopt;
  MpiGroups groups = make_mpi_groups(tp);
  set_log_rank(groups.world_config.world_size > 1 ? groups.world_config.world_rank : -1);
  return groups;
}

}  // namespace linnet
