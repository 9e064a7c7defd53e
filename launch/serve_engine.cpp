#include "launch/serve_engine.h"

#include <cstdio>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "launch/job.h"
#include "runtime/loss.h"

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

// --- ServeQueue --------------------------------------------------------------------

ServeQueue::Admit ServeQueue::submit(std::vector<ServeChoice> choices, std::shared_ptr<ServeChannel> channel) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return Admit::kClosed;
    const int64_t n = static_cast<int64_t>(choices.size());
    if (in_flight_ + n > max_in_flight_) return Admit::kFull;
    in_flight_ += n;
    queued_.push_back({std::move(choices), std::move(channel), std::chrono::steady_clock::now()});
  }
  cv_.notify_all();
  return Admit::kOk;
}

void ServeQueue::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
}

bool ServeQueue::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

std::vector<ServeQueue::Submission> ServeQueue::take(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout.count() > 0) cv_.wait_for(lock, timeout, [&] { return !queued_.empty() || woken_; });
  woken_ = false;
  std::vector<Submission> out = std::move(queued_);
  queued_.clear();
  return out;
}

void ServeQueue::notify() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_ = true;
  }
  cv_.notify_all();
}

void ServeQueue::finished(int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  in_flight_ -= n;
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

void ServeMetrics::engine_state(int64_t running, int64_t waiting, int64_t pages_in_use, int64_t pages_total,
                                int64_t prefix_hit_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  running_ = running;
  waiting_ = waiting;
  pages_in_use_ = pages_in_use;
  pages_total_ = pages_total;
  prefix_hit_tokens_ = prefix_hit_tokens;
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
  render_histogram(out, "linnet_step_sequences", "Sequences per engine step (decode rows and prompt chunks)", batch_);
  render_histogram(out, "linnet_time_to_first_token_seconds", "From a request's arrival to its first token", ttft_);
  render_histogram(out, "linnet_inter_token_latency_seconds", "Between consecutive tokens of a request", itl_);
  return out;
}

// --- the step plan -----------------------------------------------------------------

namespace {

// What every rank applies before a step, decided on the group's first rank.
struct Plan {
  struct Add {
    int64_t id = 0, after = -1;
    bool score_prompt = false;
    BatchRequest request;
  };
  std::vector<Add> adds;
  std::vector<int64_t> cancels;
  bool shutdown = false;
};

class Writer {
 public:
  template <class T>
  void pod(const T& v) {
    const char* p = reinterpret_cast<const char*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    pod<uint64_t>(v.size());
    const char* p = reinterpret_cast<const char*>(v.data());
    bytes.insert(bytes.end(), p, p + v.size() * sizeof(T));
  }
  std::vector<char> bytes;
};

class Reader {
 public:
  explicit Reader(const std::vector<char>& b) : b_(b) {}
  template <class T>
  T pod() {
    LINNET_CHECK(at_ + sizeof(T) <= b_.size(), "step plan truncated");
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> vec() {
    const uint64_t n = pod<uint64_t>();
    LINNET_CHECK(n <= (b_.size() - at_) / sizeof(T), "step plan truncated");
    std::vector<T> v(n);
    std::memcpy(v.data(), b_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
    return v;
  }

 private:
  const std::vector<char>& b_;
  size_t at_ = 0;
};

std::vector<char> encode(const Plan& plan) {
  Writer w;
  w.pod<uint64_t>(plan.adds.size());
  for (const Plan::Add& a : plan.adds) {
    w.pod(a.id);
    w.pod(a.after);
    w.pod<uint8_t>(a.score_prompt);
    const BatchRequest& r = a.request;
    w.vec(r.prompt);
    const SamplingParams& s = r.sampling;
    for (double d : {s.temperature, s.top_p, s.min_p, s.repetition_penalty, s.presence_penalty, s.frequency_penalty}) {
      w.pod(d);
    }
    w.pod(s.top_k);
    w.pod(s.seed);
    w.pod(s.vocab_limit);
    w.pod(r.max_new_tokens);
    w.vec(r.eos_ids);
    w.pod(r.top_logprobs);
  }
  w.vec(plan.cancels);
  w.pod<uint8_t>(plan.shutdown);
  return std::move(w.bytes);
}

Plan decode(const std::vector<char>& bytes) {
  Reader r(bytes);
  Plan plan;
  const uint64_t n = r.pod<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) {
    Plan::Add a;
    a.id = r.pod<int64_t>();
    a.after = r.pod<int64_t>();
    a.score_prompt = r.pod<uint8_t>() != 0;
    BatchRequest& q = a.request;
    q.prompt = r.vec<int32_t>();
    SamplingParams& s = q.sampling;
    for (double* d : {&s.temperature, &s.top_p, &s.min_p, &s.repetition_penalty, &s.presence_penalty,
                      &s.frequency_penalty}) {
      *d = r.pod<double>();
    }
    s.top_k = r.pod<int64_t>();
    s.seed = r.pod<uint64_t>();
    s.vocab_limit = r.pod<int64_t>();
    q.max_new_tokens = r.pod<int64_t>();
    q.eos_ids = r.vec<int64_t>();
    q.top_logprobs = r.pod<int64_t>();
    plan.adds.push_back(std::move(a));
  }
  plan.cancels = r.vec<int64_t>();
  plan.shutdown = r.pod<uint8_t>() != 0;
  return plan;
}

// MPI_Ibcast completed by polling: a rank with nothing to run sleeps between tests
// instead of spinning in a blocking broadcast (Open MPI busy-waits), which would take a
// core from the ranks that compute.
void polled_broadcast(MPI_Comm comm, void* data, int bytes, bool idle) {
  MPI_Request req;
  LINNET_MPI_CHECK(MPI_Ibcast(data, bytes, MPI_BYTE, 0, comm, &req));
  int done = 0;
  for (int spins = 0; !done; ++spins) {
    LINNET_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (!done && (idle || spins > 20000)) std::this_thread::sleep_for(std::chrono::microseconds(idle ? 1000 : 50));
  }
}

// The plan from the group's first rank: a fixed header {bytes}, then the bytes.
Plan broadcast_plan(MPI_Comm comm, bool root, const Plan& mine, bool idle) {
  std::vector<char> bytes;
  if (root) bytes = encode(mine);
  int64_t size = static_cast<int64_t>(bytes.size());
  polled_broadcast(comm, &size, sizeof size, idle);
  LINNET_CHECK(size >= 0 && size < (int64_t{1} << 31), "step plan of " << size << " bytes");
  bytes.resize(static_cast<size_t>(size));
  polled_broadcast(comm, bytes.data(), static_cast<int>(size), false);
  return root ? mine : decode(bytes);
}

// World rank 0's record of a running choice.
struct Live {
  std::shared_ptr<ServeChannel> channel;
  int choice = 0;
  Request request;  // for the stop-string check
  StopScan scan;
  std::chrono::steady_clock::time_point arrived, last_token;
  bool first = true;
};

}  // namespace

void run_serve_loop(Engine& engine, const ServeLoopConfig& c) {
  using Clock = std::chrono::steady_clock;
  MpiGroups& groups = *c.groups;
  LINNET_CHECK(groups.world_config.dp_size == 1, "serve runs one tp group");
  const bool root = groups.world_config.world_rank == 0;
  MPI_Comm comm = groups.tp->comm();
  std::map<int64_t, Live> live;  // root
  int64_t next_id = 0;

  SessionOptions so;
  so.prefix_caching = c.prefix_caching;
  if (root) {
    so.stop_check = [&](int64_t id, int32_t token) {
      Live& l = live.at(id);
      return l.scan.push(*c.tokenizer, l.request, token);
    };
    so.on_token = [&](int64_t id, const GenerationResult& g) {
      Live& l = live.at(id);
      const auto now = Clock::now();
      if (l.first) {
        c.metrics->first_token(std::chrono::duration<double>(now - l.arrived).count());
        l.first = false;
      } else {
        c.metrics->inter_token(std::chrono::duration<double>(now - l.last_token).count());
      }
      l.last_token = now;
      ServeEvent e;
      e.kind = ServeEvent::Kind::kToken;
      e.choice = l.choice;
      e.token = g.ids.back();
      if (!g.logprobs.empty() && g.logprobs.size() == g.ids.size()) e.logprobs = g.logprobs.back();
      l.channel->push(std::move(e));
    };
    so.on_done = [&](int64_t id, GenerationResult& g) {
      const auto it = live.find(id);
      if (it == live.end()) return;
      c.metrics->tokens(static_cast<int64_t>(it->second.request.ids.size()), static_cast<int64_t>(g.ids.size()));
      ServeEvent e;
      e.kind = ServeEvent::Kind::kDone;
      e.choice = it->second.choice;
      e.finish_reason = g.finish_reason;
      e.error = g.error;
      if (e.finish_reason == "cancelled" && e.error.empty()) e.error = "the server is shutting down";
      it->second.channel->push(std::move(e));
      live.erase(it);
      c.queue->finished(1);
    };
  }
  BatchSession session(engine, std::move(so));
  StopRelay relay(MPI_COMM_WORLD);
  bool draining = false;
  Clock::time_point deadline;

  for (;;) {
    const bool signalled = relay.poll();
    Plan plan;
    if (root) {
      if (signalled && !draining) {
        draining = true;
        deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(c.shutdown_grace_s * 1000.0));
        c.queue->close();
        if (c.on_drain) c.on_drain();
      }
      const bool idle = session.idle() && live.empty();
      for (auto& sub : c.queue->take(std::chrono::milliseconds(idle && !draining ? 50 : 0))) {
        std::vector<int64_t> ids(sub.choices.size());
        for (size_t k = 0; k < sub.choices.size(); ++k) {
          ServeChoice& ch = sub.choices[k];
          ids[k] = next_id++;
          Plan::Add a;
          a.id = ids[k];
          a.after = ch.after >= 0 && static_cast<size_t>(ch.after) < k ? ids[static_cast<size_t>(ch.after)] : -1;
          a.score_prompt = ch.score_prompt;
          a.request = ch.batch;
          plan.adds.push_back(std::move(a));
          Live l;
          l.channel = sub.channel;
          l.choice = static_cast<int>(k);
          l.request = std::move(ch.request);
          l.arrived = sub.arrived;
          live.emplace(ids[k], std::move(l));
        }
      }
      for (const auto& [id, l] : live) {
        if (l.channel->abandoned()) plan.cancels.push_back(id);
      }
      if (draining && ((session.idle() && plan.adds.empty()) || Clock::now() >= deadline)) {
        plan.shutdown = true;
        plan.cancels.clear();
        for (const auto& [id, l] : live) plan.cancels.push_back(id);
      }
    }
    plan = broadcast_plan(comm, root, plan, session.idle());
    for (int64_t id : plan.cancels) session.cancel(id);
    for (Plan::Add& a : plan.adds) {
      if (plan.shutdown) continue;  // never started; world rank 0 ends it below
      if (a.score_prompt && a.request.prompt.size() > 1) {
        PackedBatch b;
        const auto& p = a.request.prompt;
        b.tokens = p;
        b.positions.resize(p.size());
        b.segments.assign(p.size(), 0);
        b.labels.assign(p.size(), kIgnoreIndex);
        for (size_t i = 0; i < p.size(); ++i) b.positions[i] = static_cast<int32_t>(i);
        for (size_t i = 0; i + 1 < p.size(); ++i) b.labels[i] = p[i + 1];
        std::vector<double> lp = log_probs_packed(engine, b);
        lp.pop_back();
        if (root) {
          Live& l = live.at(a.id);
          ServeEvent e;
          e.kind = ServeEvent::Kind::kPromptLogprobs;
          e.choice = l.choice;
          e.prompt_logprobs = std::move(lp);
          l.channel->push(std::move(e));
        }
      }
      session.add(a.id, std::move(a.request), a.after >= 0 ? std::optional<int64_t>(a.after) : std::nullopt);
    }
    if (plan.shutdown) {
      if (root) {
        // Choices added in this very plan never reached the session: end them too.
        for (auto& [id, l] : live) {
          ServeEvent e;
          e.kind = ServeEvent::Kind::kDone;
          e.choice = l.choice;
          e.finish_reason = "cancelled";
          e.error = "the server is shutting down";
          l.channel->push(std::move(e));
          c.queue->finished(1);
        }
        live.clear();
      }
      break;
    }
    if (session.step() && root) c.metrics->step(session.last_step_sequences());
    if (root) {
      c.metrics->engine_state(session.running(), session.waiting(), session.pages_in_use(), session.num_pages(),
                              session.pool_stats().prefix_hit_tokens);
    }
  }
}

}  // namespace linnet
