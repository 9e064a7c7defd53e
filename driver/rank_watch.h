// RankWatch: `serve` learns within milliseconds that a rank's process ended, however it
// ended (kill -9, the OOM killer, a crash), so world rank 0 can end every open response
// with an error and name the rank before mpirun takes the job down (Open MPI 4 sends
// the survivors SIGTERM about a second after it notices, and SIGKILL a second later;
// MPI itself offers no failure notice). Without it a dead peer shows only as a
// collective that never returns (--comm-timeout, 600 s by default).
//
// How: every other rank holds one TCP connection to world rank 0, made once the model
// is loaded over the addresses rank 0 broadcasts (loopback for ranks on its host). A
// process's sockets are closed by the kernel when it ends, so a connection that closes
// without its "bye" byte is a rank that died; each side sends "bye" before an orderly
// close. One thread per process polls them. A connection counts only once it has sent
// its rank and the job's token (a random number sent by MPI), and rank 0 stops listening
// once every rank has, so nothing else that reaches the port can pose as a rank. A link
// that is cut without closing (a network partition) is not seen here: --comm-timeout
// covers it.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace linnet {

class RankWatch {
 public:
  /// Called once, on the watcher thread, when a watched rank's process ended without a
  /// bye: world rank 0 is told of any other rank, the others of rank 0. `who` names it
  /// ("rank 1 (pid 4711 on node2)").
  using OnDeath = std::function<void(int rank, const std::string& who)>;

  /// A collective over `world` (main thread, every rank): exchanges host names and pids,
  /// rank 0 listens on an ephemeral TCP port of every IPv4 address and broadcasts them,
  /// the others connect (each address tried for `connect_seconds`). A rank that cannot
  /// connect is left unwatched, with a warning naming it; nothing fails.
  RankWatch(MPI_Comm world, OnDeath on_death, double connect_seconds = 5.0);
  /// Sends bye on every connection (an orderly end) and stops the thread.
  ~RankWatch();
  RankWatch(const RankWatch&) = delete;
  RankWatch& operator=(const RankWatch&) = delete;

 private:
  void run();

  int rank_ = 0;
  OnDeath on_death_;
  std::vector<std::string> names_;  // "rank r (pid p on host)" per world rank
  uint64_t token_ = 0;              // this job's: a hello without it is dropped
  int listen_fd_ = -1;              // world rank 0, until every rank has said hello
  int expected_ = 0;                // world rank 0: connections still to accept
  struct Peer {
    int fd = -1;
    int rank = -1;   // -1 until its hello arrives (world rank 0)
    bool bye = false;
  };
  std::vector<Peer> peers_;         // the watcher thread's own once it runs
  int wake_[2] = {-1, -1};  // a pipe: the destructor wakes the thread
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace linnet
