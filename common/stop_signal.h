// Stop signals of a run: SIGINT, SIGTERM and SIGUSR1 only set a flag that the run's loops
// poll (driver/run_relay.h passes it to every rank, the step loops agree on it within a
// tp group), so a stopped run ends after the work in flight with everything finished kept.
// SIGUSR1 is there because mpirun forwards it to every rank while it never forwards
// SIGINT/SIGTERM (docs/batch-runs.md, "Signals and mpirun"). Process-wide, no MPI.
#pragma once

#include <string>

namespace linnet {

/// Installs SIGINT, SIGTERM and SIGUSR1 handlers that only record the signal
/// (async-signal-safe); after the first signal its kind gets the default action back,
/// so a second one ends the process (finished work stays in the journal).
/// main() installs them before MPI starts, so a signal during start-up is kept (the
/// run stops at its first step, exit 130) rather than killing the rank; a subcommand
/// without a graceful stop then calls release_stop_handlers. Calling it again
/// reinstalls them (after MPI_Init) except for a signal already caught.
void install_stop_handlers();

/// Gives SIGINT, SIGTERM and SIGUSR1 their default actions back (subcommands that do
/// not stop gracefully: --prompt, info, bench, ...), and ends the process by the signal
/// that was caught during start-up, if one was.
void release_stop_handlers();

/// Text the first stop signal writes to stderr at once (e.g. where the journal is);
/// empty: nothing. Set it before the signal can come; it is copied.
void set_stop_note(const std::string& note);

/// The signal a handler of install_stop_handlers caught (SIGINT, SIGTERM or SIGUSR1), else 0.
int caught_stop_signal();

}  // namespace linnet
