#include "launch/run_relay.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "launch/job.h"
#include "parallel/comm_watch.h"
#include "parallel/mpi_communicator.h"

namespace linnet {
namespace {

constexpr int kControlTag = 1;  // two int64: {kind, value}
constexpr int kRecordTag = 2;   // the bytes of one record, to world rank 0

enum ControlKind : int64_t { kStop = 1, kDone = 2, kBeat = 3 };

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

RunRelay::RunRelay(MPI_Comm world, RecordSink sink, std::function<void()> idle)
    : sink_(std::move(sink)), idle_(std::move(idle)) {
  LINNET_MPI_CHECK(MPI_Comm_dup(world, &comm_));
  LINNET_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  const size_t n = static_cast<size_t>(size_);
  peer_done_.assign(n, 0);
  records_expected_.assign(n, -1);
  records_received_.assign(n, 0);
  const auto now = Clock::now();
  last_heard_.assign(n, now);
  last_beat_ = last_progress_ = now;
  // A beat several times per timeout, at most one a second.
  const double timeout = comm_timeout();
  if (timeout > 0) beat_seconds_ = std::clamp(timeout / 5.0, 0.05, 1.0);
  if (size_ > 1) post_control_receive();
}

RunRelay::~RunRelay() {
  if (size_ > 1) {
    // Other ranks may still have told this one something (a second stop message).
    for (int flag = 1; flag;) {
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kControlTag, comm_, &flag, &st) != MPI_SUCCESS) break;
      if (flag) {
        int64_t drop[2];
        MPI_Recv(drop, 2, MPI_INT64_T, st.MPI_SOURCE, kControlTag, comm_, MPI_STATUS_IGNORE);
      }
    }
    if (control_recv_ != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&control_recv_, &done, MPI_STATUS_IGNORE);
      if (!done) {
        MPI_Cancel(&control_recv_);
        MPI_Wait(&control_recv_, MPI_STATUS_IGNORE);
      }
    }
  }
  for (Pending& p : sends_) {
    if (p.request != MPI_REQUEST_NULL) MPI_Request_free(&p.request);  // never wait in a destructor
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void RunRelay::post_control_receive() {
  LINNET_MPI_CHECK(MPI_Irecv(control_in_, 2, MPI_INT64_T, MPI_ANY_SOURCE, kControlTag, comm_, &control_recv_));
}

void RunRelay::send_control(int to, int kind, int64_t value) {
  Pending& p = sends_.emplace_back();
  const int64_t msg[2] = {kind, value};
  p.bytes.assign(reinterpret_cast<const char*>(msg), sizeof msg);
  LINNET_MPI_CHECK(MPI_Isend(p.bytes.data(), 2, MPI_INT64_T, to, kControlTag, comm_, &p.request));
}

bool RunRelay::reap_sends() {
  bool any = false;
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    LINNET_MPI_CHECK(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE));
    if (done) {
      it = sends_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  return any;
}

bool RunRelay::take_messages() {
  bool any = false;
  const auto now = Clock::now();
  for (;;) {
    int flag = 0;
    MPI_Status st;
    LINNET_MPI_CHECK(MPI_Test(&control_recv_, &flag, &st));
    if (!flag) break;
    any = true;
    const int from = st.MPI_SOURCE;
    last_heard_[static_cast<size_t>(from)] = now;
    if (control_in_[0] == kStop) stopped_ = true;
    if (control_in_[0] == kDone) {
      peer_done_[static_cast<size_t>(from)] = 1;
      records_expected_[static_cast<size_t>(from)] = control_in_[1];
    }
    post_control_receive();
  }
  if (rank_ == 0) {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      LINNET_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kRecordTag, comm_, &flag, &st));
      if (!flag) break;
      int bytes = 0;
      MPI_Get_count(&st, MPI_CHAR, &bytes);
      std::string record(static_cast<size_t>(bytes), '\0');
      LINNET_MPI_CHECK(
          MPI_Recv(record.data(), bytes, MPI_CHAR, st.MPI_SOURCE, kRecordTag, comm_, MPI_STATUS_IGNORE));
      any = true;
      last_heard_[static_cast<size_t>(st.MPI_SOURCE)] = now;
      ++records_received_[static_cast<size_t>(st.MPI_SOURCE)];
      if (sink_) sink_(std::move(record));
    }
  }
  if (any) last_progress_ = now;
  return any;
}

void RunRelay::beat(Clock::time_point now) {
  if (std::chrono::duration<double>(now - last_beat_).count() < beat_seconds_) return;
  last_beat_ = now;
  if (rank_ == 0) {
    for (int r = 1; r < size_; ++r) send_control(r, kBeat, 0);
  } else {
    send_control(0, kBeat, 0);
  }
}

void RunRelay::pass_on_signal() {
  if (caught_stop_signal() == 0 || told_stop_) return;
  told_stop_ = true;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) send_control(r, kStop, 0);
  }
}

void RunRelay::check_silence(const std::vector<int>& ranks, Clock::time_point now, const char* what) const {
  const double timeout = comm_timeout();
  if (timeout <= 0) return;
  std::string who;
  for (int r : ranks) {
    if (std::chrono::duration<double>(now - last_heard_[static_cast<size_t>(r)]).count() <= timeout) continue;
    const std::string d = describe_rank(r);
    who += (who.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + (d.empty() ? "" : " (" + d + ")");
  }
  if (who.empty()) return;
  throw Error(std::string(what) + ": no sign of progress for " + seconds_text(timeout) + " s (--comm-timeout " +
              seconds_text(timeout) + ") from " + who);
}

bool RunRelay::poll() {
  if (size_ > 1) {
    take_messages();
    pass_on_signal();
    const auto now = Clock::now();
    beat(now);
    if (reap_sends()) last_progress_ = now;
    // Messages that came while this rank computed were taken just now, so a long step
    // of its own never counts as the others' silence.
    std::vector<int> watched;
    if (rank_ == 0) {
      for (int r = 1; r < size_; ++r) watched.push_back(r);
    } else {
      watched.push_back(0);
    }
    check_silence(watched, now, "during the run");
  }
  if (caught_stop_signal() != 0) stopped_ = true;
  if (idle_) idle_();
  return stopped_;
}

std::pair<int, double> RunRelay::most_silent() const {
  if (size_ <= 1) return {-1, 0.0};
  const auto now = Clock::now();
  int who = -1;
  Clock::time_point oldest = now;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || (rank_ != 0 && r != 0)) continue;
    if (who < 0 || last_heard_[static_cast<size_t>(r)] < oldest) {
      who = r;
      oldest = last_heard_[static_cast<size_t>(r)];
    }
  }
  return {who, std::chrono::duration<double>(now - oldest).count()};
}

void RunRelay::send(std::string record) {
  if (rank_ == 0) {
    if (sink_) sink_(std::move(record));
    return;
  }
  if (record.size() > static_cast<size_t>(INT_MAX)) throw Error("a result of more than 2 GiB", "rank " + std::to_string(rank_));
  ++records_sent_;
  Pending& p = sends_.emplace_back();
  p.bytes = std::move(record);
  LINNET_MPI_CHECK(
      MPI_Isend(p.bytes.data(), static_cast<int>(p.bytes.size()), MPI_CHAR, 0, kRecordTag, comm_, &p.request));
}

void RunRelay::finish() {
  poll();  // pass a signal on before announcing
  if (size_ == 1) return;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) send_control(r, kDone, records_sent_);
  }
  const double timeout = comm_timeout();
  PollBackoff backoff;
  WaitClock clock;
  for (;;) {
    // Time this rank was stopped itself counts for nobody.
    double gap = 0;
    clock.seconds(&gap);
    if (gap > 0) {
      const auto shift = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap));
      for (auto& t : last_heard_) t += shift;
      last_progress_ += shift;
    }
    const bool arrived = take_messages();
    pass_on_signal();  // a signal while waiting
    const auto now = Clock::now();
    beat(now);
    const bool sent = reap_sends();
    if (sent) last_progress_ = now;
    if (idle_) idle_();
    std::vector<int> waiting_for;  // ranks not done, or (rank 0) whose records have not all come
    for (int r = 0; r < size_; ++r) {
      const size_t i = static_cast<size_t>(r);
      if (r == rank_) continue;
      if (!peer_done_[i] || (rank_ == 0 && records_received_[i] < records_expected_[i])) waiting_for.push_back(r);
    }
    if (waiting_for.empty() && sends_.empty()) return;
    // Rank 0 hears from every rank; the others hear from rank 0, which names a silent one.
    if (rank_ == 0) {
      check_silence(waiting_for, now, "waiting at the end of the run for the ranks still working");
    } else {
      check_silence({0}, now, "waiting at the end of the run");
    }
    // This rank's own results that rank 0 does not take in.
    if (timeout > 0 && !sends_.empty() && std::chrono::duration<double>(now - last_progress_).count() > timeout) {
      const std::string d = describe_rank(0);
      throw Error("waiting at the end of the run: rank 0 takes no result in for " + seconds_text(timeout) +
                  " s (--comm-timeout " + seconds_text(timeout) + ")" + (d.empty() ? "" : "; rank 0: " + d));
    }
    if (arrived || sent) {
      backoff.reset();
    } else {
      backoff.pause();
    }
  }
}

}  // namespace linnet
