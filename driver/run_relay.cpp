#include "driver/run_relay.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "common/stop_signal.h"
#include "parallel/comm_watch.h"

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
    : mail_(world), rank_(mail_.rank()), size_(mail_.size()), sink_(std::move(sink)), idle_(std::move(idle)) {
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
}

RunRelay::~RunRelay() {
  // Other ranks may still have told this one something (a second stop message).
  if (size_ > 1) mail_.discard(kControlTag);
}

void RunRelay::send_control(int to, int kind, int64_t value) {
  const int64_t msg[2] = {kind, value};
  mail_.send(to, kControlTag, std::string(reinterpret_cast<const char*>(msg), sizeof msg));
}

bool RunRelay::reap_sends() { return mail_.reap(); }

bool RunRelay::take_messages() {
  bool any = false;
  const auto now = Clock::now();
  std::string bytes;
  int from = 0;
  while (mail_.receive(kControlTag, bytes, &from)) {
    any = true;
    last_heard_[static_cast<size_t>(from)] = now;
    int64_t msg[2] = {0, 0};  // {kind, value}
    if (bytes.size() == sizeof msg) std::memcpy(msg, bytes.data(), sizeof msg);
    if (msg[0] == kStop) stopped_ = true;
    if (msg[0] == kDone) {
      peer_done_[static_cast<size_t>(from)] = 1;
      records_expected_[static_cast<size_t>(from)] = msg[1];
    }
  }
  if (rank_ == 0) {
    std::string record;
    while (mail_.receive(kRecordTag, record, &from)) {
      any = true;
      last_heard_[static_cast<size_t>(from)] = now;
      ++records_received_[static_cast<size_t>(from)];
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
  ++records_sent_;
  mail_.send(0, kRecordTag, std::move(record));
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
    if (waiting_for.empty() && !mail_.sending()) return;
    // Rank 0 hears from every rank; the others hear from rank 0, which names a silent one.
    if (rank_ == 0) {
      check_silence(waiting_for, now, "waiting at the end of the run for the ranks still working");
    } else {
      check_silence({0}, now, "waiting at the end of the run");
    }
    // This rank's own results that rank 0 does not take in.
    if (timeout > 0 && mail_.sending() && std::chrono::duration<double>(now - last_progress_).count() > timeout) {
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
