// The messages of `serve`'s engine loop (driver/serve_loop.cpp): step plans broadcast
// within a tp group, orders from world rank 0 to another dp group's first rank, and that
// rank's reports back. Flat little-endian bytes of the fields in order (every rank runs
// the same binary); a truncated message throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "requests/request_queue.h"
#include "runtime/batch_session.h"

namespace linnet::wire {

/// One choice to add: what every rank of the group runs, and the stop strings its first
/// rank checks.
struct Add {
  int64_t id = 0, after = -1;     // global choice id; the choice whose prompt pages it waits for
  bool score_prompt = false;      // echo with logprobs
  BatchRequest request;
  std::vector<std::string> stop;  // only in orders (a group's first rank checks them)
};

/// What every rank of a group applies before a step, or what world rank 0 orders a
/// group's first rank to do.
struct Plan {
  std::vector<Add> adds;
  std::vector<int64_t> cancels;
  bool shutdown = false;
};

/// An event of choice `id` as a group's first rank reports it.
struct WireEvent {
  int64_t id = 0;
  ServeEvent event;  // choice is filled in by world rank 0
};

/// A group's report to world rank 0: events and the group's engine state.
struct Report {
  std::vector<WireEvent> events;
  std::vector<int64_t> steps;  // sequences of each step since the last report
  int64_t running = 0, waiting = 0, pages_in_use = 0, pages_total = 0, prefix_hit_tokens = 0;
  int64_t spec_steps = 0, spec_proposed = 0, spec_accepted = 0;  // the group's SpeculativeStats
  bool bye = false;            // the group has shut down
};

/// `plan` as bytes; with_stop: the adds' stop strings too (orders).
std::string encode(const Plan& plan, bool with_stop);
/// @throws Error when the bytes are truncated.
Plan decode(const std::string& bytes, bool with_stop);
std::string encode(const Report& report);
/// @throws Error when the bytes are truncated.
Report decode_report(const std::string& bytes);

}  // namespace linnet::wire
