#include "parallel/comm_watch.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <numeric>
#include <thread>

#include "common/error.h"

namespace linnet {
namespace {

constexpr int kSlots = 12;  // groups whose collectives the arrival table counts, per rank

// One rank's row of the arrival table, in node-shared memory; only its rank writes it.
struct ArrivalRow {
  std::atomic<int32_t> world_rank;
  std::atomic<int32_t> pid;
  std::atomic<int64_t> entered[kSlots];  // collectives entered, per group column
};
static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "the arrival table needs lock-free atomics (it is shared between processes)");

struct WatchState {
  double timeout_s = kDefaultCommTimeoutSeconds;
  bool initialized = false;
  int world_rank = 0;
  std::vector<int> pids;           // by world rank
  std::vector<std::string> hosts;  // by world rank
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Win win = MPI_WIN_NULL;
  ArrivalRow* mine = nullptr;
  std::vector<ArrivalRow*> rows;  // by node rank
  int next_slot = 0;              // lowest column this rank has not used
};

WatchState& state() {
  static WatchState s;
  return s;
}

// Microseconds a wait yields before it sleeps (LINNET_COMM_SPIN_US, for measurements).
// 10 ms covers the skew between the ranks of a tensor-parallel group at one collective
// (their shares of a GEMM end microseconds to milliseconds apart): with 50 us, tp 2
// decode of the 1.1B shape ran at 8.9 tok/s against 12.5 with 20 ms, each late peer
// costing a sleep of up to 1 ms (bench, 2026-12-02).
int64_t spin_us() {
  static const int64_t us = [] {
    const char* v = std::getenv("LINNET_COMM_SPIN_US");
    return v ? std::max<int64_t>(0, std::atoll(v)) : int64_t{10000};
  }();
  return us;
}

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  throw Error(std::string(call) + " failed: " + std::string(buf, static_cast<size_t>(len)));
}

const ArrivalRow* row_of(int world_rank) {
  for (const ArrivalRow* r : state().rows) {
    if (r->world_rank.load(std::memory_order_relaxed) == world_rank) return r;
  }
  return nullptr;
}

// The one-letter state in /proc/PID/stat (R, S, D, T, Z, ...), or 0 when it is gone.
char proc_state(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(in, text);
  const size_t paren = text.rfind(')');  // the command name may hold spaces and ')'
  if (paren == std::string::npos || paren + 2 >= text.size()) return 0;
  return text[paren + 2];
}

std::string state_words(char s) {
  switch (s) {
    case 0:
    case 'Z':
    case 'X':
      return "it has exited";
    case 'T':
    case 't':
      return "stopped (SIGSTOP or a debugger)";
    case 'D':
      return "in uninterruptible I/O";
    case 'R':
      return "running";
    default:
      return "sleeping";
  }
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 16) return out + ", ... (" + std::to_string(ranks.size()) + " in all)";
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return out;
}

}  // namespace

void set_comm_timeout(double seconds) { state().timeout_s = seconds; }

double comm_timeout() { return state().timeout_s; }

void init_comm_watch(MPI_Comm world) {
  WatchState& s = state();
  if (s.initialized) return;
  int size = 1;
  MPI_Comm_rank(world, &s.world_rank);
  MPI_Comm_size(world, &size);
  const int pid = static_cast<int>(::getpid());
  s.pids.assign(static_cast<size_t>(size), 0);
  MPI_Allgather(&pid, 1, MPI_INT, s.pids.data(), 1, MPI_INT, world);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> names(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world);
  for (int r = 0; r < size; ++r) {
    const char* n = names.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    s.hosts.emplace_back(n, strnlen(n, MPI_MAX_PROCESSOR_NAME));
  }

  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, s.world_rank, MPI_INFO_NULL, &s.node);
  MPI_Comm_set_errhandler(s.node, MPI_ERRORS_RETURN);
  void* base = nullptr;
  const int rc = MPI_Win_allocate_shared(sizeof(ArrivalRow), 1, MPI_INFO_NULL, s.node, &base, &s.win);
  int ok = rc == MPI_SUCCESS ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, s.node);
  if (ok) {
    s.mine = new (base) ArrivalRow;
    s.mine->world_rank.store(s.world_rank);
    s.mine->pid.store(pid);
    for (auto& e : s.mine->entered) e.store(0);
    MPI_Barrier(s.node);  // every row is written before any rank reads one
    int node_size = 1;
    MPI_Comm_size(s.node, &node_size);
    for (int r = 0; r < node_size; ++r) {
      MPI_Aint bytes = 0;
      int disp = 0;
      void* p = nullptr;
      if (MPI_Win_shared_query(s.win, r, &bytes, &disp, &p) == MPI_SUCCESS && p) {
        s.rows.push_back(static_cast<ArrivalRow*>(p));
      }
    }
  } else {
    s.win = MPI_WIN_NULL;  // a window made on some ranks only is left to MPI_Finalize
  }
  s.initialized = true;
}

void finalize_comm_watch() {
  WatchState& s = state();
  if (!s.initialized || s.node == MPI_COMM_NULL) return;
  // MPI_Win_free waits for every rank of the node with a spinning barrier: a rank that
  // is done would take a core from rank 0 while it writes the output. Sleep instead.
  MPI_Request barrier = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(s.node, &barrier) == MPI_SUCCESS) {
    PollBackoff backoff;
    for (int done = 0; !done;) {
      if (MPI_Test(&barrier, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      if (!done) backoff.pause();
    }
  }
  s.rows.clear();
  s.mine = nullptr;
  if (s.win != MPI_WIN_NULL) MPI_Win_free(&s.win);
  MPI_Comm_free(&s.node);
  s.initialized = false;
}

std::string describe_rank(int world_rank) {
  const WatchState& s = state();
  if (!s.initialized || world_rank < 0 || world_rank >= static_cast<int>(s.pids.size())) return {};
  if (const ArrivalRow* row = row_of(world_rank)) {
    const int pid = row->pid.load(std::memory_order_relaxed);
    return "pid " + std::to_string(pid) + " on this host, " + state_words(proc_state(pid));
  }
  return "on host " + s.hosts[static_cast<size_t>(world_rank)];
}

void PollBackoff::pause() {
  const auto now = std::chrono::steady_clock::now();
  if (polls_++ == 0) spin_start_ = now;
  if (sleep_us_ == 0) {
    if (now - spin_start_ < std::chrono::microseconds(spin_us())) {
      // Yield rather than spin: alone on its core this returns at once (the poll stays
      // a spin), and a co-located rank or kernel thread that is runnable gets the core.
      sched_yield();
      return;
    }
    sleep_us_ = 20;
  } else {
    sleep_us_ = std::min<int64_t>(sleep_us_ * 2, 1000);
  }
  std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
}

double WaitClock::seconds(double* gap) {
  const auto now = std::chrono::steady_clock::now();
  const double since_last = std::chrono::duration<double>(now - last_).count();
  double left_out = 0;
  if (since_last > 1.0) {  // this process did not run: it was stopped
    left_out = since_last;
    start_ += now - last_;
  }
  last_ = now;
  if (gap) *gap = left_out;
  return std::chrono::duration<double>(now - start_).count();
}

GroupWatch::GroupWatch(MPI_Comm comm, std::string name) : name_(std::move(name)) {
  int size = 1;
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size);
  WatchState& s = state();
  // The members agree on the highest column any of them would use next, so each rank's
  // groups get distinct columns and a group has the same column on every member.
  int slot = s.next_slot;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &slot, 1, MPI_INT, MPI_MAX, comm), "MPI_Allreduce (GroupWatch)");
  s.next_slot = slot + 1;
  slot_ = (s.mine != nullptr && slot < kSlots) ? slot : -1;
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  world_ranks_.assign(static_cast<size_t>(size), MPI_UNDEFINED);
  MPI_Group_translate_ranks(group, size, ranks.data(), world, world_ranks_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
}

int64_t GroupWatch::enter() {
  ++entered_;
  if (slot_ >= 0) state().mine->entered[slot_].store(entered_, std::memory_order_relaxed);
  return entered_;
}

void GroupWatch::wait(MPI_Request& request, const char* op, int64_t number) const {
  int done = 0;
  check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), op);
  if (done) return;
  const double timeout = comm_timeout();
  WaitClock clock;
  PollBackoff backoff;
  for (;;) {
    backoff.pause();
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), op);
    if (done) return;
    if (clock.seconds() > timeout && timeout > 0) {
      std::vector<int> members(world_ranks_);
      throw Error(std::string(op) + " of the " + name_ + " (world ranks " + rank_list(members) +
                  ") made no progress for " + seconds_text(timeout) + " s (--comm-timeout " + seconds_text(timeout) +
                  ", collective " + std::to_string(number) + " of the group): " + missing_ranks(number));
    }
  }
}

std::string GroupWatch::missing_ranks(int64_t number) const {
  const WatchState& s = state();
  if (!s.initialized) return "which rank is missing is not known here";
  std::vector<std::string> parts;
  std::vector<int> remote;
  std::vector<std::string> remote_hosts;
  for (size_t g = 0; g < world_ranks_.size(); ++g) {
    const int wr = world_ranks_[g];
    if (static_cast<int>(g) == rank_ || wr == MPI_UNDEFINED) continue;
    const ArrivalRow* row = row_of(wr);
    if (!row) {
      remote.push_back(wr);
      const std::string& h = s.hosts[static_cast<size_t>(wr)];
      if (std::find(remote_hosts.begin(), remote_hosts.end(), h) == remote_hosts.end()) remote_hosts.push_back(h);
      continue;
    }
    const int pid = row->pid.load(std::memory_order_relaxed);
    const char st = proc_state(pid);
    const std::string where = "pid " + std::to_string(pid) + " on this host, " + state_words(st);
    if (slot_ < 0) {
      parts.push_back("rank " + std::to_string(wr) + " (" + where + ")");
      continue;
    }
    const int64_t at = row->entered[slot_].load(std::memory_order_relaxed);
    if (at < number) {
      parts.push_back("rank " + std::to_string(wr) + " has not arrived (" + where + ", at collective " +
                      std::to_string(at) + ")");
    } else if (st == 0 || st == 'T' || st == 't' || st == 'Z' || st == 'X') {
      parts.push_back("rank " + std::to_string(wr) + " (pid " + std::to_string(pid) + " on this host) arrived but " +
                      (st == 'T' || st == 't' ? "is " : "") + state_words(st));
    }
  }
  if (!remote.empty()) {
    std::string hosts;
    for (const auto& h : remote_hosts) hosts += (hosts.empty() ? "" : ", ") + h;
    parts.push_back(std::string(remote.size() == 1 ? "rank " : "ranks ") + rank_list(remote) + " on " +
                    (remote_hosts.size() == 1 ? "host " : "hosts ") + hosts +
                    ": not known whether they arrived");
  }
  if (parts.empty()) return "every rank of the group has arrived, yet the collective does not complete";
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

}  // namespace linnet
