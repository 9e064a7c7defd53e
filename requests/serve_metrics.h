// What `serve` reports of itself: /metrics counters and histograms (ServeMetrics) and the
// /health verdict (ServeHealth). The engine loop writes them, HTTP threads read them;
// thread-safe, no MPI.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace linnet {

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
  /// Speculative decoding's totals so far (--speculative-config; SpeculativeStats):
  /// sequence-steps that carried guesses, guesses run, guesses kept. Until first called,
  /// /metrics has no speculation lines.
  void speculation(int64_t steps, int64_t proposed, int64_t accepted);
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
  bool speculating_ = false;
  int64_t spec_steps_ = 0, spec_proposed_ = 0, spec_accepted_ = 0;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  int64_t running_ = 0, waiting_ = 0, pages_in_use_ = 0, pages_total_ = 0, prefix_hit_tokens_ = 0;
  int64_t steps_ = 0, max_step_sequences_ = 0;
  Histogram ttft_, itl_, batch_;
};

}  // namespace linnet
