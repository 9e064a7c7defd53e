// run_serve_loop: the main thread of every rank of `serve`.
//
// Roles. World rank 0 takes the HTTP submissions (ServeQueue), gives every choice a
// global id and hands each submission to the dp group with the fewest choices in
// flight: its own group 0 directly, another group by an MPI message to that group's
// first rank ("orders": new choices, cancellations, shutdown). Each group's first rank
// decides its group's step plan and broadcasts it to its tp group before every step
// (so all its ranks make the same BatchSession calls), checks stop strings, and reports
// tokens and finishes: world rank 0 pushes them to the request's ServeChannel, the other
// first ranks send them to world rank 0 after each step ("events"). Only these main
// threads call MPI (MPI_THREAD_FUNNELED).
//
// Idle ranks never spin in a blocking collective: broadcasts complete by polling with
// sleeps, and the first ranks of idle groups sleep between probes for orders.
#include <cstring>
#include <list>
#include <thread>

#include "common/error.h"
#include "launch/job.h"
#include "launch/run_relay.h"
#include "launch/serve_engine.h"
#include "launch/serve_wire.h"
#include "runtime/loss.h"

namespace linnet {
namespace {

using wire::Add;
using wire::Plan;
using wire::Report;
using wire::WireEvent;
using wire::decode;
using wire::decode_report;
using wire::encode;

using Clock = std::chrono::steady_clock;

constexpr int kOrderTag = 7801;   // world rank 0 -> a group's first rank
constexpr int kEventTag = 7802;   // a group's first rank -> world rank 0

// --- MPI ---------------------------------------------------------------------------

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
  if (root) bytes = encode(mine, false);
  int64_t size = static_cast<int64_t>(bytes.size());
  polled_broadcast(comm, &size, sizeof size, idle);
  LINNET_CHECK(size >= 0 && size < (int64_t{1} << 31), "step plan of " << size << " bytes");
  bytes.resize(static_cast<size_t>(size));
  polled_broadcast(comm, bytes.data(), static_cast<int>(size), false);
  return root ? mine : decode(bytes, false);
}

// Point-to-point messages in flight. Sends never block: world rank 0 and a group's
// first rank may both be sending a large message to each other (rendezvous), so each
// keeps receiving while its own sends complete.
class Outgoing {
 public:
  void send(std::vector<char> bytes, int dest, int tag) {
    LINNET_CHECK(bytes.size() < (size_t{1} << 31), "serve message of " << bytes.size() << " bytes");
    pending_.emplace_back();
    Pending& p = pending_.back();
    p.bytes = std::move(bytes);
    LINNET_MPI_CHECK(MPI_Isend(p.bytes.data(), static_cast<int>(p.bytes.size()), MPI_BYTE, dest, tag, MPI_COMM_WORLD,
                               &p.request));
    progress();
  }
  void progress() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      LINNET_MPI_CHECK(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE));
      it = done ? pending_.erase(it) : std::next(it);
    }
  }
  bool empty() const { return pending_.empty(); }

 private:
  struct Pending {
    std::vector<char> bytes;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::list<Pending> pending_;  // stable addresses for MPI
};

// A message with `tag` from `source` (MPI_ANY_SOURCE too) if one is there.
bool try_recv(int source, int tag, std::vector<char>& bytes, int* from = nullptr) {
  int flag = 0;
  MPI_Status st;
  LINNET_MPI_CHECK(MPI_Iprobe(source, tag, MPI_COMM_WORLD, &flag, &st));
  if (!flag) return false;
  int count = 0;
  LINNET_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &count));
  bytes.resize(static_cast<size_t>(count));
  LINNET_MPI_CHECK(MPI_Recv(bytes.data(), count, MPI_BYTE, st.MPI_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  if (from) *from = st.MPI_SOURCE;
  return true;
}

// --- the loop ----------------------------------------------------------------------

// World rank 0's record of a choice in flight (in any group).
struct Live {
  std::shared_ptr<ServeChannel> channel;
  int choice = 0;
  int group = 0;
  int64_t prompt_tokens = 0, generated = 0;
  Clock::time_point arrived, last_token;
  bool first = true, cancel_sent = false;
};

// A group's first rank's record of a choice its session runs: the stop-string check.
struct Track {
  Request request;
  StopScan scan;
};

}  // namespace

void run_serve_loop(Engine& engine, const ServeLoopConfig& c) {
  MpiGroups& groups = *c.groups;
  const WorldConfig& w = groups.world_config;
  const bool world_root = w.world_rank == 0;
  const bool group_root = w.tp_rank == 0;
  const int dp = w.dp_size;
  MPI_Comm tp_comm = groups.tp->comm();

  std::map<int64_t, Live> live;     // world rank 0: every choice in flight
  std::vector<int64_t> load(static_cast<size_t>(dp), 0);  // world rank 0: choices in flight per group
  std::vector<Report> states(static_cast<size_t>(dp));    // world rank 0: the other groups' last state
  std::map<int64_t, Track> tracks;  // group roots: this group's choices
  Report outbox;                    // group roots but world rank 0: what goes to world rank 0
  Outgoing outgoing;                // sends in flight

  // World rank 0: an event of choice `id` reaches its handler.
  auto deliver = [&](int64_t id, ServeEvent e) {
    const auto it = live.find(id);
    if (it == live.end()) return;
    Live& l = it->second;
    e.choice = l.choice;
    if (e.kind == ServeEvent::Kind::kToken) {
      const auto now = Clock::now();
      if (l.first) {
        c.metrics->first_token(std::chrono::duration<double>(now - l.arrived).count());
        l.first = false;
      } else {
        c.metrics->inter_token(std::chrono::duration<double>(now - l.last_token).count());
      }
      l.last_token = now;
      ++l.generated;
    }
    const bool done = e.kind == ServeEvent::Kind::kDone;
    if (done) c.metrics->tokens(l.prompt_tokens, l.generated);
    if (done && e.finish_reason == "cancelled" && e.error.empty()) e.error = "the server is shutting down";
    l.channel->push(std::move(e));
    if (done) {
      --load[static_cast<size_t>(l.group)];
      live.erase(it);
      c.queue->finished(1);
    }
  };
  // A group root: an event of its session.
  auto emit = [&](int64_t id, ServeEvent e) {
    if (world_root) {
      deliver(id, std::move(e));
    } else {
      outbox.events.push_back({id, std::move(e)});
    }
  };

  SessionOptions so;
  so.prefix_caching = c.prefix_caching;
  if (group_root) {
    so.stop_check = [&](int64_t id, int32_t token) {
      Track& t = tracks.at(id);
      return t.scan.push(*c.tokenizer, t.request, token);
    };
    so.on_token = [&](int64_t id, const GenerationResult& g) {
      ServeEvent e;
      e.kind = ServeEvent::Kind::kToken;
      e.token = g.ids.back();
      if (!g.logprobs.empty() && g.logprobs.size() == g.ids.size()) e.logprobs = g.logprobs.back();
      emit(id, std::move(e));
    };
    so.on_done = [&](int64_t id, GenerationResult& g) {
      tracks.erase(id);
      ServeEvent e;
      e.kind = ServeEvent::Kind::kDone;
      e.finish_reason = g.finish_reason;
      e.error = g.error;
      emit(id, std::move(e));
    };
  }
  BatchSession session(engine, std::move(so));
  RunRelay relay(MPI_COMM_WORLD, {});  // stop signals only: serve never reaches a finish line

  // Every rank: the plan's calls on the session; false once it says shut down.
  // Cancels go after the adds: a choice whose client left before it was taken from the
  // queue arrives with its add and its cancel in one plan, and must never start.
  auto apply = [&](Plan& plan) {
    if (plan.shutdown) {
      for (int64_t id : plan.cancels) session.cancel(id);
      return false;
    }
    for (Add& a : plan.adds) {
      if (a.score_prompt && a.request.prompt.size() > 1) {
        PackedBatch b;
        const auto& p = a.request.prompt;
        b.tokens = p;
        b.positions.resize(p.size());
        b.segments.assign(p.size(), 0);
        b.labels.assign(p.size(), kIgnoreIndex);
        for (size_t i = 0; i < p.size(); ++i) b.positions[i] = static_cast<int32_t>(i);
        for (size_t i = 0; i + 1 < p.size(); ++i) b.labels[i] = p[i + 1];
        // The top_logprobs alternatives of each prompt token too (OpenAI's and vLLM's echo
        // lists them; lm-evaluation-harness's is_greedy reads them).
        PackedLogprobs lp = log_probs_packed(engine, b, std::max<int64_t>(0, a.request.top_logprobs),
                                             a.request.sampling.vocab_limit);
        lp.logprob.pop_back();
        lp.top.pop_back();
        if (group_root) {
          ServeEvent e;
          e.kind = ServeEvent::Kind::kPromptLogprobs;
          e.prompt_logprobs = std::move(lp.logprob);
          e.prompt_top = std::move(lp.top);
          emit(a.id, std::move(e));
        }
      }
      session.add(a.id, std::move(a.request), a.after >= 0 ? std::optional<int64_t>(a.after) : std::nullopt);
    }
    for (int64_t id : plan.cancels) session.cancel(id);
    return true;
  };
  // A group root: records the stop strings of the choices it is about to add.
  auto track = [&](const Plan& plan) {
    for (const Add& a : plan.adds) {
      Track t;
      t.request.ids = a.request.prompt;
      t.request.settings.stop = a.stop;
      tracks.emplace(a.id, std::move(t));
    }
  };

  if (world_root) {
    int64_t next_id = 0;
    bool draining = false;
    Clock::time_point deadline;
    std::vector<bool> bye(static_cast<size_t>(dp), false);
    bye[0] = true;
    auto receive_reports = [&] {
      std::vector<char> bytes;
      int from = 0;
      while (try_recv(MPI_ANY_SOURCE, kEventTag, bytes, &from)) {
        const size_t g = static_cast<size_t>(from / w.tp_size);
        Report rep = decode_report(bytes);
        for (WireEvent& we : rep.events) deliver(we.id, std::move(we.event));
        for (int64_t s : rep.steps) c.metrics->step(s);
        if (rep.bye) bye[g] = true;
        rep.events.clear();
        states[g] = std::move(rep);
      }
    };
    if (c.health) c.health->loop_turned(Clock::now());
    for (;;) {
      if (relay.poll() && !draining) {
        draining = true;
        deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(c.shutdown_grace_s * 1000.0));
        c.queue->close();
        if (c.on_drain) c.on_drain();
      }
      if (c.health) {
        const auto now = Clock::now();
        c.health->loop_turned(now);
        const auto [rank, silent] = relay.most_silent();
        c.health->peers_heard(rank, silent, now);
      }
      if (dp > 1) {
        receive_reports();
        outgoing.progress();
      }
      Plan plan;
      std::vector<Plan> orders(static_cast<size_t>(dp));
      const bool local_idle = session.idle();
      const auto wait = live.empty() && !draining ? std::chrono::milliseconds(50)
                        : local_idle              ? std::chrono::milliseconds(1)
                                                  : std::chrono::milliseconds(0);
      std::vector<ServeQueue::Submission> subs = c.queue->take(wait);
      // Admission: a submission taken once a stop signal was caught (this rank's own,
      // seen at once; another rank's, seen at the last poll) is refused, and its handler
      // answers 503; every other one runs.
      const bool refuse = draining || caught_stop_signal() != 0;
      for (auto& sub : subs) {
        if (refuse) {
          sub.channel->admit(false);
          c.queue->finished(static_cast<int64_t>(sub.choices.size()));
          continue;
        }
        sub.channel->admit(true);
        // The group with the fewest choices in flight takes the whole submission (its
        // choices share prompt pages).
        const int g = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
        Plan& target = g == 0 ? plan : orders[static_cast<size_t>(g)];
        std::vector<int64_t> ids(sub.choices.size());
        for (size_t k = 0; k < sub.choices.size(); ++k) {
          ServeChoice& ch = sub.choices[k];
          ids[k] = next_id++;
          Add a;
          a.id = ids[k];
          a.after = ch.after >= 0 && static_cast<size_t>(ch.after) < k ? ids[static_cast<size_t>(ch.after)] : -1;
          a.score_prompt = ch.score_prompt;
          a.request = std::move(ch.batch);
          a.stop = ch.request.settings.stop;
          target.adds.push_back(std::move(a));
          Live l;
          l.channel = sub.channel;
          l.choice = static_cast<int>(k);
          l.group = g;
          l.prompt_tokens = static_cast<int64_t>(ch.request.ids.size());
          l.arrived = sub.arrived;
          live.emplace(ids[k], std::move(l));
          ++load[static_cast<size_t>(g)];
        }
      }
      for (auto& [id, l] : live) {
        if (!l.channel->abandoned() || l.cancel_sent) continue;
        (l.group == 0 ? plan : orders[static_cast<size_t>(l.group)]).cancels.push_back(id);
        l.cancel_sent = true;
      }
      bool shutdown = false;
      if (draining) {
        const bool all_idle = live.empty() && plan.adds.empty();
        if (all_idle || Clock::now() >= deadline) {
          shutdown = true;
          plan.shutdown = true;
          for (auto& o : orders) o.shutdown = true;
        }
      }
      for (int g = 1; g < dp; ++g) {
        Plan& o = orders[static_cast<size_t>(g)];
        if (!o.adds.empty() || !o.cancels.empty() || o.shutdown) outgoing.send(encode(o, true), g * w.tp_size, kOrderTag);
      }
      if (shutdown) {
        // Cancel what group 0 still runs (after the grace) in the same plan.
        for (const auto& [id, l] : live) {
          if (l.group == 0) plan.cancels.push_back(id);
        }
        plan.adds.clear();
      }
      track(plan);
      plan = broadcast_plan(tp_comm, true, plan, local_idle);
      if (!apply(plan)) break;
      if (session.step()) c.metrics->step(session.last_step_sequences());
      int64_t running = session.running(), waiting = session.waiting(), in_use = session.pages_in_use(),
              total = session.num_pages(), hits = session.pool_stats().prefix_hit_tokens;
      for (int g = 1; g < dp; ++g) {
        const Report& s = states[static_cast<size_t>(g)];
        running += s.running;
        waiting += s.waiting;
        in_use += s.pages_in_use;
        total += s.pages_total;
        hits += s.prefix_hit_tokens;
      }
      c.metrics->engine_state(running, waiting, in_use, total, hits);
    }
    // Submissions queued since the last take (none once the queue is closed) are refused.
    for (auto& sub : c.queue->take(std::chrono::milliseconds(0))) {
      sub.channel->admit(false);
      c.queue->finished(static_cast<int64_t>(sub.choices.size()));
    }
    // The other groups' last events (cancellations), until each has shut down.
    while (std::find(bye.begin(), bye.end(), false) != bye.end() || !outgoing.empty()) {
      receive_reports();
      outgoing.progress();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // Choices that never reached a session (added in the shutdown step).
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
    return;
  }

  if (group_root) {
    // The first rank of another group: orders from world rank 0, reports back.
    for (;;) {
      relay.poll();  // passes a signal caught here on to world rank 0
      outgoing.progress();
      Plan plan;
      bool got = false;
      std::vector<char> bytes;
      while (try_recv(0, kOrderTag, bytes)) {
        Plan o = decode(bytes, true);
        got = true;
        for (Add& a : o.adds) plan.adds.push_back(std::move(a));
        plan.cancels.insert(plan.cancels.end(), o.cancels.begin(), o.cancels.end());
        plan.shutdown = plan.shutdown || o.shutdown;
      }
      if (!got && session.idle()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      if (plan.shutdown) {
        for (const auto& [id, t] : tracks) plan.cancels.push_back(id);
        plan.adds.clear();
      }
      track(plan);
      plan = broadcast_plan(tp_comm, true, plan, session.idle());
      const bool go_on = apply(plan);
      if (go_on && session.step()) outbox.steps.push_back(session.last_step_sequences());
      outbox.running = session.running();
      outbox.waiting = session.waiting();
      outbox.pages_in_use = session.pages_in_use();
      outbox.pages_total = session.num_pages();
      outbox.prefix_hit_tokens = session.pool_stats().prefix_hit_tokens;
      outbox.bye = !go_on;
      if (!outbox.events.empty() || !outbox.steps.empty() || outbox.bye || got) {
        outgoing.send(encode(outbox), 0, kEventTag);
        outbox.events.clear();
        outbox.steps.clear();
      }
      if (!go_on) {
        while (!outgoing.empty()) {
          outgoing.progress();
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return;
      }
    }
  }

  // The other ranks of a group follow its first rank's plans.
  for (;;) {
    relay.poll();  // passes a signal caught here on to world rank 0
    Plan plan = broadcast_plan(tp_comm, false, Plan{}, session.idle());
    if (!apply(plan)) return;
    session.step();
  }
}

}  // namespace linnet
