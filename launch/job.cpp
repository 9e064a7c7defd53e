#include "launch/job.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>

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
    std::exit(kLoadErrorExit);
  }
  MPI_Abort(world_, kLoadErrorExit);
  std::abort();
}

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
  // A second Ctrl-C ends the process the default way.
  std::signal(sig, SIG_DFL);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int caught_stop_signal() { return static_cast<int>(g_stop_signal); }

StopRelay::StopRelay(MPI_Comm world) : world_(world) {
  MPI_Comm_rank(world_, &rank_);
  MPI_Comm_size(world_, &size_);
  if (size_ > 1) MPI_Irecv(&inbox_, 1, MPI_INT, MPI_ANY_SOURCE, kStopTag, world_, &recv_);
}

StopRelay::~StopRelay() {
  if (size_ <= 1) return;
  // Other ranks may have told this one more than once; take those messages off the queue.
  for (int flag = 1; flag;) {
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kStopTag, world_, &flag, &st);
    if (flag) {
      int drop = 0;
      MPI_Recv(&drop, 1, MPI_INT, st.MPI_SOURCE, kStopTag, world_, MPI_STATUS_IGNORE);
    }
  }
  if (recv_ != MPI_REQUEST_NULL) {
    int done = 0;
    MPI_Test(&recv_, &done, MPI_STATUS_IGNORE);
    if (!done) {
      MPI_Cancel(&recv_);
      MPI_Wait(&recv_, MPI_STATUS_IGNORE);
    }
  }
}

bool StopRelay::poll() {
  if (!stopped_ && recv_ != MPI_REQUEST_NULL) {
    int done = 0;
    MPI_Test(&recv_, &done, MPI_STATUS_IGNORE);
    if (done) stopped_ = true;  // recv_ is MPI_REQUEST_NULL now
  }
  if (caught_stop_signal() != 0) {
    stopped_ = true;
    if (!told_) {
      told_ = true;
      static const int kOne = 1;
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        MPI_Request req;
        MPI_Isend(&kOne, 1, MPI_INT, r, kStopTag, world_, &req);
        MPI_Request_free(&req);
      }
    }
  }
  return stopped_;
}

std::optional<MpiGroups> make_run_groups(Job& job, int tp) {
  if (!job.load_phase([&] { WorldConfig::make(job.rank(), job.size(), tp, 0, 1); })) return std::nullopt;
  MpiGroups groups = make_mpi_groups(tp);
  set_log_rank(groups.world_config.world_size > 1 ? groups.world_config.world_rank : -1);
  return groups;
}

}  // namespace linnet
