// run_serve_loop: the main thread of every rank of `serve`.
//
// Roles. World rank 0 takes the HTTP submissions (RequestQueue), gives every choice a
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
// sleeps, and the first ranks of idle groups sleep between probes for orders. The
// messages go through a Mailbox (parallel/mailbox.h); each role is its own function:
// Router (world rank 0), run_group_leader (the other groups' first ranks), run_follower.
#include <algorithm>
#include <deque>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "common/error.h"
#include "common/stop_signal.h"
#include "driver/serve_loop.h"
#include "driver/run_relay.h"
#include "driver/serve_wire.h"
#include "parallel/mailbox.h"
#include "requests/request_queue.h"
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

// The plan from the group's first rank: a fixed header {bytes}, then the bytes.
Plan broadcast_plan(MPI_Comm comm, bool root, const Plan& mine, bool idle) {
  std::string bytes;
  if (root) bytes = encode(mine, false);
  int64_t size = static_cast<int64_t>(bytes.size());
  polled_broadcast(comm, &size, sizeof size, 0, idle);
  LINNET_CHECK(size >= 0 && size < (int64_t{1} << 31), "step plan of " << size << " bytes");
  bytes.resize(static_cast<size_t>(size));
  polled_broadcast(comm, bytes.data(), static_cast<int>(size), 0, false);
  return root ? mine : decode(bytes, false);
}

// Waits until every send of `mail` has completed.
void drain_sends(Mailbox& mail) {
  while (mail.sending()) {
    mail.reap();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The echo of a prompt's own logprobs (and their top_logprobs alternatives): one packed
// pass over the prompt before the choice joins the session. OpenAI's and vLLM's echo list
// them; lm-evaluation-harness's loglikelihood and is_greedy read them.
ServeEvent prompt_logprobs(Engine& engine, const BatchRequest& r) {
  PackedBatch b;
  const auto& p = r.prompt;
  b.tokens = p;
  b.positions.resize(p.size());
  b.segments.assign(p.size(), 0);
  b.labels.assign(p.size(), kIgnoreIndex);
  for (size_t i = 0; i < p.size(); ++i) b.positions[i] = static_cast<int32_t>(i);
  for (size_t i = 0; i + 1 < p.size(); ++i) b.labels[i] = p[i + 1];
  PackedLogprobs lp = log_probs_packed(engine, b, std::max<int64_t>(0, r.top_logprobs), r.sampling.vocab_limit);
  lp.logprob.pop_back();
  lp.top.pop_back();
  ServeEvent e;
  e.kind = ServeEvent::Kind::kPromptLogprobs;
  e.prompt_logprobs = std::move(lp.logprob);
  e.prompt_top = std::move(lp.top);
  return e;
}

// What every rank of a dp group shares: the group's BatchSession and how a step plan is
// applied to it. On the group's first rank also the stop-string check of each choice and
// the events of its choices, handed to `emit` (world rank 0: to the handlers; another
// group's first rank: into its report).
class GroupSession {
 public:
  using Emit = std::function<void(int64_t id, ServeEvent e)>;

  GroupSession(Engine& engine, const ServeLoopConfig& c, bool group_root, Emit emit)
      : engine_(engine), group_root_(group_root), tokenizer_(c.tokenizer), emit_(std::move(emit)),
        session_(engine, session_options(c, group_root)) {}

  BatchSession& session() { return session_; }
  bool idle() const { return session_.idle(); }

  // Every rank: the plan's calls on the session; false once it says shut down. Cancels
  // go after the adds: a choice whose client left before it was taken from the queue
  // arrives with its add and its cancel in one plan, and must never start.
  bool apply(Plan& plan) {
    if (plan.shutdown) {
      for (int64_t id : plan.cancels) session_.cancel(id);
      return false;
    }
    for (Add& a : plan.adds) {
      if (a.score_prompt && a.request.prompt.size() > 1) {
        ServeEvent e = prompt_logprobs(engine_, a.request);  // a collective pass: every rank
        if (group_root_) emit_(a.id, std::move(e));
      }
      session_.add(a.id, std::move(a.request), a.after >= 0 ? std::optional<int64_t>(a.after) : std::nullopt);
    }
    for (int64_t id : plan.cancels) session_.cancel(id);
    return true;
  }

  // The group's first rank: records the stop strings of the choices it is about to add.
  void track(const Plan& plan) {
    for (const Add& a : plan.adds) {
      Request r;  // what the text needs of the choice: its prompt ids and stop strings (copied)
      r.ids = a.request.prompt;
      r.settings.stop = a.stop;
      Track t;
      t.text = std::make_unique<CompletionStream>(*tokenizer_, r);
      tracks_.emplace(a.id, std::move(t));
    }
  }

  // The group's first rank: the ids of the choices its session runs.
  std::vector<int64_t> tracked() const {
    std::vector<int64_t> ids;
    for (const auto& [id, t] : tracks_) ids.push_back(id);
    return ids;
  }

 private:
  // A choice's text on the group's first rank: its tokens detokenized once, held back
  // while they could start a stop string, cut at the first one (CompletionStream).
  struct Track {
    std::unique_ptr<CompletionStream> text;
    // What each stop-checked token added, oldest first, sent with it by on_token (a step
    // with speculation checks several tokens of a request before the first on_token).
    std::deque<std::string> pending;
  };

  SessionOptions session_options(const ServeLoopConfig& c, bool group_root) {
    SessionOptions so;
    so.prefix_caching = c.prefix_caching;
    so.speculative = c.speculative;
    so.draft = c.draft;
    if (!group_root) return so;
    // Each new token passes the stop check before it is appended (SessionOptions), so
    // the text is pushed there and on_token sends what it added.
    so.stop_check = [this](int64_t id, int32_t token) {
      Track& t = tracks_.at(id);
      t.pending.emplace_back();
      try {
        t.pending.back() = t.text->push(token);
      } catch (const Error&) {
        // an id the tokenizer cannot decode shows no text
      }
      return t.text->stopped();
    };
    so.on_token = [this](int64_t id, const GenerationResult& g) {
      Track& t = tracks_.at(id);
      ServeEvent e;
      e.kind = ServeEvent::Kind::kToken;
      e.token = g.ids.back();
      if (!g.logprobs.empty() && g.logprobs.size() == g.ids.size()) e.logprobs = g.logprobs.back();
      if (!t.pending.empty()) {
        e.text = std::move(t.pending.front());
        t.pending.pop_front();
      }
      emit_(id, std::move(e));
    };
    so.on_done = [this](int64_t id, GenerationResult& g) {
      ServeEvent e;
      e.kind = ServeEvent::Kind::kDone;
      if (const auto it = tracks_.find(id); it != tracks_.end()) {
        e.text = it->second.text->finish();
        e.stopped = it->second.text->stopped();
        tracks_.erase(it);
      }
      e.finish_reason = g.finish_reason;
      e.error = g.error;
      emit_(id, std::move(e));
    };
    return so;
  }

  Engine& engine_;
  bool group_root_;
  const Tokenizer* tokenizer_;  // the group's first rank: the choices' text
  Emit emit_;
  std::map<int64_t, Track> tracks_;  // declared before the session, whose callbacks use it
  BatchSession session_;
};

// World rank 0: takes the HTTP submissions, hands each to the dp group with the fewest
// choices in flight (its own group 0 in its step plan, another group by an order), and
// delivers every event to its request's channel.
class Router {
 public:
  Router(Engine& engine, const ServeLoopConfig& c, RunRelay& relay, Mailbox& mail)
      : c_(c), w_(c.groups->world_config), relay_(relay), mail_(mail),
        group_(engine, c, true, [this](int64_t id, ServeEvent e) { deliver(id, std::move(e)); }),
        load_(static_cast<size_t>(w_.dp_size), 0), states_(static_cast<size_t>(w_.dp_size)),
        bye_(static_cast<size_t>(w_.dp_size), false) {
    bye_[0] = true;
  }

  void run() {
    if (c_.health) c_.health->loop_turned(Clock::now());
    for (;;) {
      watch();
      Plan plan;
      std::vector<Plan> orders(static_cast<size_t>(w_.dp_size));
      const bool local_idle = group_.idle();
      const auto wait = live_.empty() && !draining_ ? std::chrono::milliseconds(50)
                        : local_idle                ? std::chrono::milliseconds(1)
                                                    : std::chrono::milliseconds(0);
      admit(c_.queue->take(wait), plan, orders);
      cancel_abandoned(plan, orders);
      const bool shutdown = draining_ && ((live_.empty() && plan.adds.empty()) || Clock::now() >= deadline_);
      if (shutdown) {
        plan.shutdown = true;
        for (auto& o : orders) o.shutdown = true;
      }
      for (int g = 1; g < w_.dp_size; ++g) {
        Plan& o = orders[static_cast<size_t>(g)];
        if (!o.adds.empty() || !o.cancels.empty() || o.shutdown) {
          mail_.send(g * w_.tp_size, kOrderTag, encode(o, true));
        }
      }
      if (shutdown) {
        // Cancel what group 0 still runs (after the grace) in the same plan.
        for (const auto& [id, l] : live_) {
          if (l.group == 0) plan.cancels.push_back(id);
        }
        plan.adds.clear();
      }
      group_.track(plan);
      plan = broadcast_plan(c_.groups->tp->comm(), true, plan, local_idle);
      if (!group_.apply(plan)) break;
      BatchSession& s = group_.session();
      if (s.step()) c_.metrics->step(s.last_step_sequences());
      report_state();
    }
    finish();
  }

 private:
  // World rank 0's record of a choice in flight (in any group).
  struct Live {
    std::shared_ptr<ServeChannel> channel;
    int choice = 0;
    int group = 0;
    int64_t prompt_tokens = 0, generated = 0;
    Clock::time_point arrived, last_token;
    bool first = true, cancel_sent = false;
  };

  // Once a turn: a stop signal starts the drain; /health learns the loop turned and who
  // was heard from last; the other groups' reports come in.
  void watch() {
    if (relay_.poll() && !draining_) {
      draining_ = true;
      deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(c_.shutdown_grace_s * 1000.0));
      c_.queue->close();
      if (c_.on_drain) c_.on_drain();
    }
    if (c_.health) {
      const auto now = Clock::now();
      c_.health->loop_turned(now);
      const auto [rank, silent] = relay_.most_silent();
      c_.health->peers_heard(rank, silent, now);
    }
    if (w_.dp_size > 1) {
      receive_reports();
      mail_.reap();
    }
  }

  // An event of choice `id` reaches its handler.
  void deliver(int64_t id, ServeEvent e) {
    const auto it = live_.find(id);
    if (it == live_.end()) return;
    Live& l = it->second;
    e.choice = l.choice;
    if (e.kind == ServeEvent::Kind::kToken) {
      const auto now = Clock::now();
      if (l.first) {
        c_.metrics->first_token(std::chrono::duration<double>(now - l.arrived).count());
        l.first = false;
      } else {
        c_.metrics->inter_token(std::chrono::duration<double>(now - l.last_token).count());
      }
      l.last_token = now;
      ++l.generated;
    }
    const bool done = e.kind == ServeEvent::Kind::kDone;
    if (done) c_.metrics->tokens(l.prompt_tokens, l.generated);
    if (done && e.finish_reason == "cancelled" && e.error.empty()) e.error = "the server is shutting down";
    l.channel->push(std::move(e));
    if (done) {
      --load_[static_cast<size_t>(l.group)];
      live_.erase(it);
      c_.queue->finished(1);
    }
  }

  // The other groups' reports: their events, steps, engine state and goodbyes.
  void receive_reports() {
    std::string bytes;
    int from = 0;
    while (mail_.receive(kEventTag, bytes, &from)) {
      const size_t g = static_cast<size_t>(from / w_.tp_size);
      Report rep = decode_report(bytes);
      for (WireEvent& we : rep.events) deliver(we.id, std::move(we.event));
      for (int64_t s : rep.steps) c_.metrics->step(s);
      if (rep.bye) bye_[g] = true;
      rep.events.clear();
      states_[g] = std::move(rep);
    }
  }

  // Admission: a submission taken once a stop signal was caught (this rank's own, seen
  // at once; another rank's, seen at the last poll) is refused, and its handler answers
  // 503; every other one runs, all its choices in the group with the fewest choices in
  // flight (they share prompt pages), under fresh global ids.
  void admit(std::vector<RequestQueue::Submission> subs, Plan& plan, std::vector<Plan>& orders) {
    const bool refuse = draining_ || caught_stop_signal() != 0;
    for (auto& sub : subs) {
      if (refuse) {
        sub.channel->admit(false);
        c_.queue->finished(static_cast<int64_t>(sub.choices.size()));
        continue;
      }
      sub.channel->admit(true);
      const int g = static_cast<int>(std::min_element(load_.begin(), load_.end()) - load_.begin());
      Plan& target = g == 0 ? plan : orders[static_cast<size_t>(g)];
      std::vector<int64_t> ids(sub.choices.size());
      for (size_t k = 0; k < sub.choices.size(); ++k) {
        ServeChoice& ch = sub.choices[k];
        ids[k] = next_id_++;
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
        live_.emplace(ids[k], std::move(l));
        ++load_[static_cast<size_t>(g)];
      }
    }
  }

  // Choices whose client left: a cancel to their group, once.
  void cancel_abandoned(Plan& plan, std::vector<Plan>& orders) {
    for (auto& [id, l] : live_) {
      if (!l.channel->abandoned() || l.cancel_sent) continue;
      (l.group == 0 ? plan : orders[static_cast<size_t>(l.group)]).cancels.push_back(id);
      l.cancel_sent = true;
    }
  }

  // /metrics: the engine state of every group after this step.
  void report_state() {
    BatchSession& s = group_.session();
    int64_t running = s.running(), waiting = s.waiting(), in_use = s.pages_in_use(), total = s.num_pages(),
            hits = s.pool_stats().prefix_hit_tokens;
    SpeculativeStats spec = s.speculative_stats();
    for (int g = 1; g < w_.dp_size; ++g) {
      const Report& r = states_[static_cast<size_t>(g)];
      running += r.running;
      waiting += r.waiting;
      in_use += r.pages_in_use;
      total += r.pages_total;
      hits += r.prefix_hit_tokens;
      spec.steps += r.spec_steps;
      spec.proposed += r.spec_proposed;
      spec.accepted += r.spec_accepted;
    }
    c_.metrics->engine_state(running, waiting, in_use, total, hits);
    if (c_.speculative.enabled()) c_.metrics->speculation(spec.steps, spec.proposed, spec.accepted);
  }

  // After the shutdown step: refuse what is still queued, take the other groups' last
  // events until each has said goodbye, and end the choices that never reached a session.
  void finish() {
    for (auto& sub : c_.queue->take(std::chrono::milliseconds(0))) {
      sub.channel->admit(false);
      c_.queue->finished(static_cast<int64_t>(sub.choices.size()));
    }
    while (std::find(bye_.begin(), bye_.end(), false) != bye_.end() || mail_.sending()) {
      receive_reports();
      mail_.reap();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (auto& [id, l] : live_) {
      ServeEvent e;
      e.kind = ServeEvent::Kind::kDone;
      e.choice = l.choice;
      e.finish_reason = "cancelled";
      e.error = "the server is shutting down";
      l.channel->push(std::move(e));
      c_.queue->finished(1);
    }
    live_.clear();
  }

  const ServeLoopConfig& c_;
  const WorldConfig& w_;
  RunRelay& relay_;
  Mailbox& mail_;
  std::map<int64_t, Live> live_;  // every choice in flight; declared before group_, whose events use it
  GroupSession group_;
  std::vector<int64_t> load_;     // choices in flight per group
  std::vector<Report> states_;    // the other groups' last state
  std::vector<bool> bye_;         // which groups have shut down
  int64_t next_id_ = 0;
  bool draining_ = false;
  Clock::time_point deadline_;
};

// The first rank of a dp group other than world rank 0's: orders from world rank 0 in,
// its group's step plans out, and a report (events, steps, state) back after each step.
void run_group_leader(Engine& engine, const ServeLoopConfig& c, RunRelay& relay, Mailbox& mail) {
  Report outbox;  // what goes to world rank 0
  GroupSession group(engine, c, true, [&outbox](int64_t id, ServeEvent e) { outbox.events.push_back({id, std::move(e)}); });
  for (;;) {
    relay.poll();  // passes a signal caught here on to world rank 0
    mail.reap();
    Plan plan;
    bool got = false;
    std::string bytes;
    while (mail.receive(kOrderTag, bytes, nullptr, 0)) {
      Plan o = decode(bytes, true);
      got = true;
      for (Add& a : o.adds) plan.adds.push_back(std::move(a));
      plan.cancels.insert(plan.cancels.end(), o.cancels.begin(), o.cancels.end());
      plan.shutdown = plan.shutdown || o.shutdown;
    }
    if (!got && group.idle()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (plan.shutdown) {
      for (int64_t id : group.tracked()) plan.cancels.push_back(id);
      plan.adds.clear();
    }
    group.track(plan);
    plan = broadcast_plan(c.groups->tp->comm(), true, plan, group.idle());
    const bool go_on = group.apply(plan);
    BatchSession& s = group.session();
    if (go_on && s.step()) outbox.steps.push_back(s.last_step_sequences());
    outbox.running = s.running();
    outbox.waiting = s.waiting();
    outbox.pages_in_use = s.pages_in_use();
    outbox.pages_total = s.num_pages();
    outbox.prefix_hit_tokens = s.pool_stats().prefix_hit_tokens;
    outbox.spec_steps = s.speculative_stats().steps;
    outbox.spec_proposed = s.speculative_stats().proposed;
    outbox.spec_accepted = s.speculative_stats().accepted;
    outbox.bye = !go_on;
    if (!outbox.events.empty() || !outbox.steps.empty() || outbox.bye || got) {
      mail.send(0, kEventTag, encode(outbox));
      outbox.events.clear();
      outbox.steps.clear();
    }
    if (!go_on) {
      drain_sends(mail);
      return;
    }
  }
}

// The other ranks of a group follow its first rank's plans.
void run_follower(Engine& engine, const ServeLoopConfig& c, RunRelay& relay) {
  GroupSession group(engine, c, false, {});
  for (;;) {
    relay.poll();  // passes a signal caught here on to world rank 0
    Plan plan = broadcast_plan(c.groups->tp->comm(), false, Plan{}, group.idle());
    if (!group.apply(plan)) return;
    group.session().step();
  }
}

}  // namespace

void run_serve_loop(Engine& engine, const ServeLoopConfig& c) {
  const WorldConfig& w = c.groups->world_config;
  // Collective over the world, in this order on every rank.
  RunRelay relay(MPI_COMM_WORLD, {});  // stop signals only: serve never reaches a finish line
  Mailbox mail(MPI_COMM_WORLD);        // orders and reports between the groups' first ranks
  if (w.world_rank == 0) {
    Router(engine, c, relay, mail).run();
  } else if (w.tp_rank == 0) {
    run_group_leader(engine, c, relay, mail);
  } else {
    run_follower(engine, c, relay);
  }
}

}  // namespace linnet
