// The hand-off between a front (HTTP handler threads) and the engine loop of `serve`:
// a handler submits a request's choices to the RequestQueue and reads their tokens from
// its ServeChannel; the engine thread (driver/serve_loop.h, world rank 0) takes the
// submissions and pushes events back. Threads and locks only: no MPI, no engine.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "requests/request.h"
#include "runtime/batch_session.h"

namespace linnet {

/// One generation the engine runs (a choice of a prompt).
struct ServeChoice {
  Request request;            // prompt ids and settings (stop strings: the stop check on tp rank 0)
  BatchRequest batch;         // what every rank runs (batch_request(request, eos, seed))
  bool score_prompt = false;  // echo with logprobs: log p of each prompt token first
  int after = -1;             // a choice of the same submission with this prompt: wait for its pages
};

/// What the engine tells a request's handler, in order.
struct ServeEvent {
  enum class Kind { kToken, kPromptLogprobs, kDone };
  Kind kind = Kind::kToken;
  int choice = 0;
  int32_t token = 0;
  std::optional<TokenLogprobs> logprobs;  // with the token, when asked for
  std::vector<double> prompt_logprobs;    // kPromptLogprobs: log p(prompt[i + 1]), [P - 1]
  std::vector<std::vector<std::pair<int32_t, float>>> prompt_top;  // and the top_logprobs alternatives of each
  std::string text;                       // kToken: the text this token adds to what may be shown; kDone: the
                                          // rest (CompletionStream on the group's first rank: each token is
                                          // detokenized once, there)
  bool stopped = false;                   // kDone: a stop string ended the text
  std::string finish_reason;              // kDone: stop, length, error, cancelled
  std::string error;                      // kDone with error / cancelled: why
};

/// The events of one HTTP request; shared by its handler thread and the engine thread.
class ServeChannel {
 public:
  /// Engine thread: appends events and wakes the handler.
  void push(ServeEvent event);
  /// Handler: waits up to `timeout` for events and moves every queued one into `out`.
  /// Returns false when there were none.
  bool wait(std::vector<ServeEvent>& out, std::chrono::milliseconds timeout);
  /// Handler: the client is gone (or the response ended); the engine cancels the
  /// unfinished choices at its next step and frees their KV pages.
  void abandon() { abandoned_ = true; }
  bool abandoned() const { return abandoned_; }

  /// Whether the engine loop took the request in (it runs) or refused it (a stop signal
  /// had been caught: the handler answers 503).
  enum class Admission { kPending, kAdmitted, kRefused };
  /// Engine thread: decides once, when it takes the submission from the RequestQueue.
  void admit(bool admitted);
  /// Handler: waits up to `timeout` for admit(); kPending when it did not come.
  Admission wait_admission(std::chrono::milliseconds timeout);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<ServeEvent> events_;
  std::atomic<bool> abandoned_{false};
  Admission admission_ = Admission::kPending;
};

/// The inbox of the engine thread: submissions from handler threads; thread-safe.
class RequestQueue {
 public:
  struct Submission {
    std::vector<ServeChoice> choices;
    std::shared_ptr<ServeChannel> channel;
    std::chrono::steady_clock::time_point arrived;
  };
  /// At most `max_in_flight` choices may be submitted and unfinished at once.
  explicit RequestQueue(int64_t max_in_flight) : max_in_flight_(max_in_flight) {}
  enum class Admit { kOk, kFull, kTooMany, kClosed };
  /// Queues the choices (kOk), or refuses them: kTooMany when they are more than
  /// `max_in_flight` (they could never fit), kFull when they would pass the in-flight
  /// bound now, kClosed once close() was called (draining).
  Admit submit(std::vector<ServeChoice> choices, std::shared_ptr<ServeChannel> channel);
  /// The in-flight bound.
  int64_t capacity() const { return max_in_flight_; }
  /// Refuses every later submission (those queued are still taken).
  void close();
  bool closed() const;
  /// Engine thread: takes every queued submission, waiting up to `timeout` when none is.
  std::vector<Submission> take(std::chrono::milliseconds timeout);
  /// Wakes the engine thread (e.g. a channel was abandoned).
  void notify();
  /// Engine thread: `n` choices finished.
  void finished(int64_t n);

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Submission> queued_;
  int64_t max_in_flight_;
  int64_t in_flight_ = 0;
  bool closed_ = false, woken_ = false;
};

}  // namespace linnet
