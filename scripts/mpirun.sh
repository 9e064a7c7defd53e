#!/usr/bin/env bash
# mpirun with what these machines need: Open MPI refuses to run as root and to start
# more ranks than cores unless told. On a GPU node a user types plain `mpirun -np N`.
set -euo pipefail
# --bind-to none: linnet-tp pins each rank's threads to its share of the cores itself
# (kernels/cpu/threads.h); Open MPI's default (one core per rank) would squeeze them.
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
# Containers often lack the cross-memory-attach permission Open MPI's shared-memory
# transport tries first; copy-in/copy-out works everywhere.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
exec mpirun "${flags[@]}" "$@"
