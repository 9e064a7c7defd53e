#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (ctest prints its summary).
# Extra args go to ctest, e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure --timeout 300 "$@"
