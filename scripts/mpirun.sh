#!/usr/bin/env bash
# mpirun with what these machines need: Open MPI refuses to run as root and to start
# more ranks than cores unless told. On a GPU node a user types plain `mpirun -np N`.
#
# Signals (docs/batch-runs.md, "Signals and mpirun"): Open MPI 4.1's mpirun does not pass SIGINT or
# SIGTERM on to the ranks. It sends them SIGCONT, SIGTERM a second later and SIGKILL a
# second after that, and exits 1 whatever they return. It does forward SIGUSR1, on which
# linnet-tp stops as on SIGINT (finished work kept, exit 130), and then exits with the
# ranks' code. So this script runs mpirun in a session of its own (a terminal's Ctrl-C
# reaches only this script), turns the first SIGINT/SIGTERM/SIGHUP into SIGUSR1 for
# mpirun, a second into another SIGUSR1 (the ranks' handler is spent: they end at once,
# their finished work in the journal), a third into SIGKILL of mpirun, and exits 130
# when a signal ended the run.
set -euo pipefail
# --bind-to none: linnet-tp pins each rank's threads to its share of the cores itself
# (kernels/cpu/threads.h); Open MPI's default (one core per rank) would squeeze them.
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
# Containers often lack the cross-memory-attach permission Open MPI's shared-memory
# transport tries first; copy-in/copy-out works everywhere.
export OMPI_MCA_btl_vader_single_copy_mechanism=none

signals=0
pid=
on_signal() {
  signals=$((signals + 1))
  [ -n "$pid" ] || exit 130
  if [ "$signals" -le 2 ]; then
    kill -USR1 "$pid" 2>/dev/null || true
  else
    kill -KILL "$pid" 2>/dev/null || true
  fi
}
trap on_signal INT TERM HUP
# A background command would read /dev/null: hand it this script's stdin explicitly.
setsid mpirun "${flags[@]}" "$@" <&0 &
pid=$!
rc=0
while :; do
  if wait "$pid"; then rc=0; else rc=$?; fi
  kill -0 "$pid" 2>/dev/null || break  # wait returns early when a trapped signal comes
done
# The last wait may have been cut short just as mpirun ended; bash keeps its status.
if wait "$pid" 2>/dev/null; then rc=0; else rc=$?; fi
if [ "$signals" -gt 0 ] && [ "$rc" -ne 0 ]; then exit 130; fi
exit "$rc"
