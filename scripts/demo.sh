#!/usr/bin/env bash
# Sets up, builds, and runs the main job: 2 tensor-parallel ranks generate from the
# real stories260k checkpoint with the prompt "Once upon a time".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
MODEL="${LINNET_DEMO_MODEL:-../shared/models/stories260k}"
set -x
scripts/mpirun.sh -np 2 build/launch/linnet-tp --model "$MODEL" --prompt "Once upon a time" \
  --max-new-tokens 120 "$@"
