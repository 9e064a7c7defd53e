#include "requests/serve_metrics.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"

namespace linnet {

// --- ServeHealth -------------------------------------------------------------------

void ServeHealth::loop_turned(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!started_) heard_ = now;
  started_ = true;
  turned_ = now;
}

void ServeHealth::peers_heard(int rank, double silent_seconds, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  silent_rank_ = rank;
  heard_ = rank < 0 ? now
                    : now - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(silent_seconds));
}

std::string ServeHealth::problem(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!started_ || stall_seconds_ <= 0) return {};
  char buf[200];
  const double loop = std::chrono::duration<double>(now - turned_).count();
  if (loop > stall_seconds_) {
    std::snprintf(buf, sizeof buf,
                  "the engine loop has made no progress for %.1f s (a step is stuck: a rank may be stopped or dead)",
                  loop);
    return buf;
  }
  const double heard = std::chrono::duration<double>(now - heard_).count();
  if (silent_rank_ >= 0 && heard > stall_seconds_) {
    std::snprintf(buf, sizeof buf, "no heartbeat from rank %d for %.1f s (stopped, dead or cut off?)", silent_rank_,
                  heard);
    return buf;
  }
  return {};
}

void ServeHealth::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_.empty()) failure_ = why;
}

std::string ServeHealth::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

// --- ServeMetrics ------------------------------------------------------------------

namespace {

std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

}  // namespace

void ServeMetrics::Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

ServeMetrics::ServeMetrics() {
  ttft_.bounds = latency_bounds();
  itl_.bounds = latency_bounds();
  batch_.bounds = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  for (Histogram* h : {&ttft_, &itl_, &batch_}) h->counts.assign(h->bounds.size() + 1, 0);
  for (const char* o : {"finished", "cancelled", "failed", "rejected"}) outcomes_[o] = 0;
  for (const char* r : {"capacity", "timeout", "framing", "too_large"}) http_refused_[r] = 0;
}

void ServeMetrics::request_done(const std::string& outcome) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++outcomes_[outcome];
}

void ServeMetrics::tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lock(mutex_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void ServeMetrics::first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ttft_.observe(seconds);
}

void ServeMetrics::inter_token(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  itl_.observe(seconds);
}

void ServeMetrics::step(int64_t sequences) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++steps_;
  max_step_sequences_ = std::max(max_step_sequences_, sequences);
  batch_.observe(static_cast<double>(sequences));
}

void ServeMetrics::http_refused(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++http_refused_[reason];
}

void ServeMetrics::http_connections(int64_t open) {
  std::lock_guard<std::mutex> lock(mutex_);
  http_open_ = open;
}

void ServeMetrics::engine_state(int64_t running, int64_t waiting, int64_t pages_in_use, int64_t pages_total,
                                int64_t prefix_hit_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  running_ = running;
  waiting_ = waiting;
  pages_in_use_ = pages_in_use;
  pages_total_ = pages_total;
  prefix_hit_tokens_ = prefix_hit_tokens;
}

void ServeMetrics::speculation(int64_t steps, int64_t proposed, int64_t accepted) {
  std::lock_guard<std::mutex> lock(mutex_);
  speculating_ = true;
  spec_steps_ = steps;
  spec_proposed_ = proposed;
  spec_accepted_ = accepted;
}

void ServeMetrics::render_histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
  int64_t cumulative = 0;
  for (size_t i = 0; i <= h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    out += std::string(name) + "_bucket{le=\"" + (i < h.bounds.size() ? num(h.bounds[i]) : "+Inf") + "\"} " +
           std::to_string(cumulative) + "\n";
  }
  out += std::string(name) + "_sum " + num(h.sum) + "\n" + name + "_count " + std::to_string(h.count) + "\n";
}

std::string ServeMetrics::render() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, int64_t value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
           std::to_string(value) + "\n";
  };
  out += "# HELP linnet_requests_total Generation requests by outcome (finished, cancelled: the client left or "
         "the server stopped, failed: an engine error, rejected: refused before running)\n"
         "# TYPE linnet_requests_total counter\n";
  for (const auto& [o, n] : outcomes_) out += "linnet_requests_total{outcome=\"" + o + "\"} " + std::to_string(n) + "\n";
  metric("linnet_prompt_tokens_total", "counter", "Prompt tokens of the requests run", prompt_tokens_);
  metric("linnet_generation_tokens_total", "counter", "Tokens generated", generated_tokens_);
  metric("linnet_requests_running", "gauge", "Sequences in the running batch", running_);
  metric("linnet_requests_waiting", "gauge", "Sequences waiting for a batch slot or KV pages", waiting_);
  metric("linnet_kv_pages_in_use", "gauge", "KV cache pages held by running sequences", pages_in_use_);
  metric("linnet_kv_pages_total", "gauge", "KV cache pages of the pool", pages_total_);
  metric("linnet_prefix_cache_hit_tokens_total", "counter", "Prompt tokens whose KV pages came from the prefix cache",
         prefix_hit_tokens_);
  metric("linnet_steps_total", "counter", "Engine steps (step_paged passes)", steps_);
  metric("linnet_step_sequences_max", "gauge", "Most sequences one step has run together", max_step_sequences_);
  metric("linnet_http_connections_open", "gauge", "HTTP connections open", http_open_);
  out += "# HELP linnet_http_refused_total Connections refused or requests answered by the HTTP front itself "
         "(capacity: too many open connections; timeout: a head or body not received in time; framing: malformed "
         "HTTP framing; too_large: a head or body over its limit)\n"
         "# TYPE linnet_http_refused_total counter\n";
  for (const auto& [r, n] : http_refused_) {
    out += "linnet_http_refused_total{reason=\"" + r + "\"} " + std::to_string(n) + "\n";
  }
  if (speculating_) {
    metric("linnet_spec_decode_num_drafts_total", "counter",
           "Sequence-steps that ran speculative guesses (--speculative-config)", spec_steps_);
    metric("linnet_spec_decode_num_draft_tokens_total", "counter", "Speculative guesses run through the model",
           spec_proposed_);
    metric("linnet_spec_decode_num_accepted_tokens_total", "counter", "Speculative guesses kept", spec_accepted_);
    out += "# HELP linnet_spec_decode_acceptance_rate Guesses kept / guesses run, since the start\n"
           "# TYPE linnet_spec_decode_acceptance_rate gauge\nlinnet_spec_decode_acceptance_rate " +
           num(spec_proposed_ > 0 ? static_cast<double>(spec_accepted_) / static_cast<double>(spec_proposed_) : 0.0) +
           "\n# HELP linnet_spec_decode_mean_accepted_length Tokens a step with guesses emits per sequence on "
           "average (kept guesses + 1)\n# TYPE linnet_spec_decode_mean_accepted_length gauge\n"
           "linnet_spec_decode_mean_accepted_length " +
           num(spec_steps_ > 0 ? static_cast<double>(spec_accepted_) / static_cast<double>(spec_steps_) + 1.0 : 0.0) +
           "\n";
  }
  render_histogram(out, "linnet_step_sequences", "Sequences per engine step (decode rows and prompt chunks)", batch_);
  render_histogram(out, "linnet_time_to_first_token_seconds", "From a request's arrival to its first token", ttft_);
  render_histogram(out, "linnet_inter_token_latency_seconds", "Between consecutive tokens of a request", itl_);
  return out;
}

}  // namespace linnet
