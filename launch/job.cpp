#include "launch/job.h"

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

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
char g_stop_note[2048];
volatile std::sig_atomic_t g_stop_note_bytes = 0;

extern "C" void on_stop_signal(int sig) {
  const bool first = g_stop_signal == 0;
  g_stop_signal = sig;
  // A second signal of this kind ends the process the default way.
  std::signal(sig, SIG_DFL);
  if (first && g_stop_note_bytes > 0) {
    const ssize_t n = ::write(STDERR_FILENO, g_stop_note, static_cast<size_t>(g_stop_note_bytes));
    (void)n;
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (const int sig : {SIGINT, SIGTERM, SIGUSR1}) {
    // A signal already caught has its default action back (a second one ends the run).
    if (g_stop_signal != sig) sigaction(sig, &sa, nullptr);
  }
}

void release_stop_handlers() {
  for (const int sig : {SIGINT, SIGTERM, SIGUSR1}) std::signal(sig, SIG_DFL);
  if (const int sig = g_stop_signal; sig != 0) std::raise(sig);  // caught during start-up
}

void set_stop_note(const std::string& note) {
  g_stop_note_bytes = 0;  // a handler running now sees no half-written note
  const size_t n = std::min(note.size(), sizeof g_stop_note);
  std::memcpy(g_stop_note, note.data(), n);
  g_stop_note_bytes = static_cast<std::sig_atomic_t>(n);
}

int caught_stop_signal() { return static_cast<int>(g_stop_signal); }

std::optional<MpiGroups> make_run_groups(Job& job, int tp) {
  if (!job.load_phase([&] { WorldConfig::make(job.rank(), job.size(), tp, 0, 1); })) return std::nullopt;
  MpiGroups groups = make_mpi_groups(tp);
  set_log_rank(groups.world_config.world_size > 1 ? groups.world_config.world_rank : -1);
  return groups;
}

}  // namespace linnet
