#include "requests/request_queue.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"

namespace linnet {

// --- ServeChannel ------------------------------------------------------------------

void ServeChannel::push(ServeEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

bool ServeChannel::wait(std::vector<ServeEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
  if (events_.empty()) return false;
  for (auto& e : events_) out.push_back(std::move(e));
  events_.clear();
  return true;
}

void ServeChannel::admit(bool admitted) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (admission_ == Admission::kPending) admission_ = admitted ? Admission::kAdmitted : Admission::kRefused;
  }
  cv_.notify_all();
}

ServeChannel::Admission ServeChannel::wait_admission(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return admission_ != Admission::kPending; });
  return admission_;
}

// --- RequestQueue --------------------------------------------------------------------

RequestQueue::Admit RequestQueue::submit(std::vector<ServeChoice> choices, std::shared_ptr<ServeChannel> channel) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return Admit::kClosed;
    const int64_t n = static_cast<int64_t>(choices.size());
    if (n > max_in_flight_) return Admit::kTooMany;
    if (in_flight_ + n > max_in_flight_) return Admit::kFull;
    in_flight_ += n;
    queued_.push_back({std::move(choices), std::move(channel), std::chrono::steady_clock::now()});
  }
  cv_.notify_all();
  return Admit::kOk;
}

void RequestQueue::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
}

bool RequestQueue::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

std::vector<RequestQueue::Submission> RequestQueue::take(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout.count() > 0) cv_.wait_for(lock, timeout, [&] { return !queued_.empty() || woken_; });
  woken_ = false;
  std::vector<Submission> out = std::move(queued_);
  queued_.clear();
  return out;
}

void RequestQueue::notify() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_ = true;
  }
  cv_.notify_all();
}

void RequestQueue::finished(int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  in_flight_ -= n;
}

}  // namespace linnet
