// Rank-aware logging to stderr. Messages are prefixed "[rank r]" once the world is
// known (set_log_rank), so a line from a multi-rank job says where it came from.
#pragma once

#include <string>

namespace linnet {

/// Sets the rank shown in log prefixes; -1 (the default) shows no prefix.
void set_log_rank(int rank);
/// The rank set by set_log_rank, or -1.
int log_rank();
/// Enables info() output (off by default; --verbose turns it on).
void set_verbose(bool on);
bool verbose();

/// "[rank r] warning: msg" to stderr.
void warn(const std::string& msg);
/// "warning: msg" to stderr, no rank prefix: for what every rank sees alike (the input,
/// the model), printed by one rank only.
void warn_once(const std::string& msg);
/// "[rank r] msg" to stderr when verbose.
void info(const std::string& msg);

}  // namespace linnet
