// The engine side of `linnet-tp serve`: HTTP handler threads hand requests to the main
// thread through a ServeQueue and get their tokens back through a ServeChannel each;
// the main threads of each tp group run one BatchSession. Before each step the group's
// first rank broadcasts the step's plan (new requests with their ids and sampling
// settings, cancellations, shutdown), so every rank makes the same session calls; world
// rank 0 hands requests to the other dp groups' first ranks and gets their tokens back
// by MPI messages. Only the main threads call MPI or the engine (MPI_THREAD_FUNNELED).
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

#include "launch/generate_requests.h"
#include "parallel/mpi_communicator.h"
#include "runtime/batch_session.h"
#include "runtime/engine.h"

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
  /// Engine thread: decides once, when it takes the submission from the ServeQueue.
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

/// What /health says of the engine (world rank 0): its main thread notes that the serve
/// loop went round and when every other rank was last heard from (RunRelay's
/// heartbeats, once a second from each rank's loop); an HTTP thread asks. Stalled: the
/// loop has not gone round for `stall_seconds` (a step is stuck, e.g. waiting in a
/// collective for a stopped rank), or a rank has been silent that long. Thread-safe.
class ServeHealth {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ServeHealth(double stall_seconds = 10.0) : stall_seconds_(stall_seconds) {}
  double stall_seconds() const { return stall_seconds_; }
  /// Main thread: the loop goes round now (also once before the first turn).
  void loop_turned(Clock::time_point now);
  /// Main thread: `rank` is the rank heard from least recently, `silent_seconds` ago
  /// (rank -1: there is no other rank).
  void peers_heard(int rank, double silent_seconds, Clock::time_point now);
  /// Empty when healthy (or before loop_turned was first called), else why not.
  std::string problem(Clock::time_point now) const;
  /// Any thread: the server cannot go on (a rank's process ended): `why`. The first
  /// reason is kept; every open response then ends with an error naming it.
  void fail(const std::string& why);
  /// Empty unless fail() was called; else its reason.
  std::string failure() const;

 private:
  double stall_seconds_;
  mutable std::mutex mutex_;
  bool started_ = false;
  Clock::time_point turned_, heard_;
  int silent_rank_ = -1;
  std::string failure_;
};

/// Counters and histograms of /metrics (Prometheus text format); thread-safe.
class ServeMetrics {
 public:
  ServeMetrics();
  /// One HTTP generation request ended: outcome finished, cancelled, failed or rejected.
  void request_done(const std::string& outcome);
  void tokens(int64_t prompt, int64_t generated);
  void first_token(double seconds);
  void inter_token(double seconds);
  void step(int64_t sequences);
  /// The HTTP front refused a connection or answered a request itself with an error
  /// (reason: capacity, timeout, framing, too_large).
  void http_refused(const std::string& reason);
  /// HTTP connections open now (set before render).
  void http_connections(int64_t open);
  /// Engine state after a step.
  void engine_state(int64_t running, int64_t waiting, int64_t pages_in_use, int64_t pages_total,
                    int64_t prefix_hit_tokens);
  /// The Prometheus exposition text.
  std::string render() const;

 private:
  struct Histogram {
    std::vector<double> bounds;
    std::vector<int64_t> counts;  // per bound, not cumulative; last: +Inf
    double sum = 0;
    int64_t count = 0;
    void observe(double v);
  };
  static void render_histogram(std::string& out, const char* name, const char* help, const Histogram& h);
  mutable std::mutex mutex_;
  std::map<std::string, int64_t> outcomes_, http_refused_;
  int64_t http_open_ = 0;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  int64_t running_ = 0, waiting_ = 0, pages_in_use_ = 0, pages_total_ = 0, prefix_hit_tokens_ = 0;
  int64_t steps_ = 0, max_step_sequences_ = 0;
  Histogram ttft_, itl_, batch_;
};

/// The inbox of the engine thread: submissions from handler threads; thread-safe.
class ServeQueue {
 public:
  struct Submission {
    std::vector<ServeChoice> choices;
    std::shared_ptr<ServeChannel> channel;
    std::chrono::steady_clock::time_point arrived;
  };
  /// At most `max_in_flight` choices may be submitted and unfinished at once.
  explicit ServeQueue(int64_t max_in_flight) : max_in_flight_(max_in_flight) {}
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

/// What the engine loop needs besides the engine.
struct ServeLoopConfig {
  MpiGroups* groups = nullptr;
  const Tokenizer* tokenizer = nullptr;  // tp rank 0: the stop-string check
  ServeQueue* queue = nullptr;           // world rank 0 only
  ServeMetrics* metrics = nullptr;       // world rank 0 only
  ServeHealth* health = nullptr;         // world rank 0 only (may be null)
  std::function<void()> on_drain;        // world rank 0: a stop signal arrived (stop accepting)
  double shutdown_grace_s = 10.0;        // then unfinished requests are cancelled
  bool prefix_caching = true;
};

/// Runs the serve loop on every rank (launch/serve_loop.cpp) until a SIGINT/SIGTERM (on
/// any rank) has been drained: requests in flight finish, or are cancelled once
/// shutdown_grace_s has passed. World rank 0 admits each submission when it takes it
/// from the queue (ServeChannel::admit), and refuses those it takes once it has caught
/// a stop signal (its own, at once, or another rank's, at the next poll). With several dp groups, world rank 0 hands each
/// submission to the group with the fewest choices in flight.
/// @throws Error from the engine or MPI (the caller aborts the job).
void run_serve_loop(Engine& engine, const ServeLoopConfig& config);

}  // namespace linnet
