// RunRelay: the point-to-point side of a batch run (generate --input, loss) over the
// world. It passes a stop signal from the rank that caught it to every rank, streams
// each finished result to world rank 0 the moment it is done (rank 0 appends it to the
// journal, launch/journal.h), and is the finish line where a rank that is done waits for
// the others.
//
// Design choice: a rank still working sends a one-int heartbeat once a second (from
// poll(), once per step) to every rank that has reached the finish line. A rank of another
// dp group shares no collective with a waiting one until the end, so without it a stalled
// rank there would hang the run; with it the waiting ranks name that rank after
// --comm-timeout. Ranks still working need nothing: their own collectives are watched.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <vector>

#include <mpi.h>

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
  bool poll();

  /// Sends one finished record to world rank 0 (on rank 0: to the sink at once).
  /// @throws Error when MPI fails.
  void send(std::string record);

  /// This rank is done: tells every rank, then returns once every rank is done and every
  /// record has reached rank 0, still passing signals and records on meanwhile.
  /// @throws Error naming the ranks that are not done and have sent no sign of progress
  ///   for comm_timeout() seconds (with what is known of each: stopped, exited, host).
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    std::string bytes;  // a record, or the two ints of a control message
    MPI_Request request = MPI_REQUEST_NULL;
  };

  // Takes in whatever has arrived; true when anything did.
  bool take_messages();
  void post_control_receive();
  void send_control(int to, int kind, int64_t value);
  // Drops the sends that completed; true when any did.
  bool reap_sends();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  RecordSink sink_;
  std::function<void()> idle_;
  int64_t control_in_[2] = {0, 0};  // {kind, value} of the control message being received
  MPI_Request control_recv_ = MPI_REQUEST_NULL;
  std::list<Pending> sends_;
  bool stopped_ = false, told_stop_ = false, done_ = false;
  std::vector<char> peer_done_;             // by world rank
  std::vector<int64_t> records_expected_;   // rank 0: records each rank says it sent
  std::vector<int64_t> records_received_;   // rank 0
  int64_t records_sent_ = 0;
  std::vector<Clock::time_point> last_heard_;  // by world rank: any message from it
  Clock::time_point last_beat_, last_progress_;
  double beat_seconds_ = 1.0;
};

}  // namespace linnet
