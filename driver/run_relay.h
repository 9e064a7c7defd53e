// RunRelay: the point-to-point side of a batch run (generate --input, loss) over the
// world. It passes a stop signal from the rank that caught it to every rank, streams
// each finished result to world rank 0 the moment it is done (rank 0 appends it to the
// journal, driver/journal.h), and is the finish line where a rank that is done waits for
// the others.
//
// Design choice: heartbeats in a star. Every rank sends world rank 0 a one-int beat once a
// second (from poll(), once per step, and while it waits at the finish line), and rank 0
// beats every rank. Ranks of different dp groups share no collective until the end, so
// without them a stalled rank, or a host whose link was cut, would only be noticed by
// its own tp group (if at all); with them rank 0 names any rank silent for --comm-timeout,
// and the others notice a silent rank 0, so every rank exits within the timeout. 2 (W-1)
// messages a second in all.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <mpi.h>

#include "parallel/mailbox.h"

namespace linnet {

/// Stop signals, finished records and the finish line of one batch run (see the file header).
class RunRelay {
 public:
  /// Takes one record on world rank 0, in the order records arrive.
  using RecordSink = std::function<void(std::string record)>;

  /// Collective over `world` (it is duplicated). `sink` is used on world rank 0 only;
  /// `idle` (may be empty) runs on every poll, e.g. the journal's periodic fsync.
  RunRelay(MPI_Comm world, RecordSink sink, std::function<void()> idle = {});
  /// Takes stop messages still queued off, cancels the posted receive; never blocks.
  ~RunRelay();
  RunRelay(const RunRelay&) = delete;
  RunRelay& operator=(const RunRelay&) = delete;

  /// Call once per step (or more often); costs a few MPI_Test / MPI_Iprobe calls. Sends a
  /// signal this rank caught on to every rank, takes in stop messages, finish-line news
  /// and (rank 0) records, and sends heartbeats. True once any rank caught a stop
  /// signal; then it stays true.
  /// @throws Error naming the ranks (rank 0: any; the others: rank 0) from which nothing
  ///   came for comm_timeout() seconds (a stalled rank, a cut link).
  bool poll();

  /// Of the ranks this one watches (world rank 0: every other rank; the others: rank 0),
  /// the one heard from least recently as of the last poll(), and how many seconds ago
  /// (for serve's /health). {-1, 0} on a world of one rank.
  std::pair<int, double> most_silent() const;

  /// Sends one finished record to world rank 0 (on rank 0: to the sink at once).
  /// @throws Error when MPI fails.
  void send(std::string record);

  /// This rank is done: tells every rank, then returns once every rank is done and every
  /// record has reached rank 0, still passing signals, records and heartbeats on.
  /// @throws Error when, for comm_timeout() seconds, no sign of progress came from a
  ///   rank not done (on rank 0, naming it with what is known: stopped, exited, host),
  ///   from rank 0 (the others), or rank 0 took none of this rank's records in.
  void finish();

 private:
  using Clock = std::chrono::steady_clock;

  // Takes in whatever has arrived; true when anything did.
  bool take_messages();
  void send_control(int to, int kind, int64_t value);
  // Drops the sends that completed; true when any did.
  bool reap_sends();
  // A heartbeat (to rank 0; rank 0: to every rank) when the last one is beat_seconds_ old.
  void beat(Clock::time_point now);
  // Sends a signal this rank caught on to every rank, once.
  void pass_on_signal();
  // Throws Error ("<what>: no sign of progress ...") naming those of `ranks` silent for
  // comm_timeout() seconds.
  void check_silence(const std::vector<int>& ranks, Clock::time_point now, const char* what) const;

  Mailbox mail_;  // over a duplicate of the world
  int rank_ = 0, size_ = 1;
  RecordSink sink_;
  std::function<void()> idle_;
  bool stopped_ = false, told_stop_ = false;
  std::vector<char> peer_done_;             // by world rank
  std::vector<int64_t> records_expected_;   // rank 0: records each rank says it sent
  std::vector<int64_t> records_received_;   // rank 0
  int64_t records_sent_ = 0;
  std::vector<Clock::time_point> last_heard_;  // by world rank: any message from it
  Clock::time_point last_beat_, last_progress_;
  double beat_seconds_ = 1.0;
};

}  // namespace linnet
