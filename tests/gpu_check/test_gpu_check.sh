#!/usr/bin/env bash
# scripts/gpu_check.sh's own logic, here on the CPU (ctest label gpucheck): `prepare` from
# this build (the runtime .debs fetched, every carried binary checked with ldd against the
# unpacked prefix alone, what travels printed and held to 56 MiB), then the check itself
# with --no-gpu in an empty environment (env -i) whose library path holds only the
# carried prefix and where Open MPI's ssh / rsh agent points at nothing, as on the device
# machine. Every step must pass (the CUDA suites skip for "no CUDA device"; the shape and
# CLI steps compare the CPU backend with itself) and the summary table must list them.
# Exits 77 (skipped) with the reason when this build has no CUDA backend.
#
# Usage: test_gpu_check.sh BUILD_DIR
set -uo pipefail
BUILD=${1:?build folder}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ -x "$BUILD/tests/test_cuda_kernels" ] || { echo "SKIP: this build has no CUDA backend (nvcc not found)"; exit 77; }
WORK=$BUILD/gpu-check-test
rm -rf "$WORK" && mkdir -p "$WORK"

"$ROOT/scripts/gpu_check.sh" prepare --build-dir "$BUILD" --dest "$WORK/carry" 2>&1 | tee "$WORK/prepare.log"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "FAIL: prepare"; exit 1; }
grep -q "^\[gpu_check +[0-9]*s\] travels: [0-9.]* MiB" "$WORK/prepare.log" || { echo "FAIL: prepare printed no size"; exit 1; }
for b in linnet-tp test_cuda_kernels test_cuda_engine test_nccl compare_backends mpirun.openmpi orted; do
  grep -q "ldd $b: every library from the prefix" "$WORK/prepare.log" || { echo "FAIL: no ldd verdict for $b"; exit 1; }
done

env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$WORK" TMPDIR=/tmp \
  LD_LIBRARY_PATH="$WORK/prefix/usr/lib/x86_64-linux-gnu:$WORK/prefix/usr/lib/x86_64-linux-gnu/openmpi/lib" \
  OMPI_MCA_plm_rsh_agent=/nonexistent/ssh GPU_CHECK_PREFIX="$WORK/prefix" GPU_CHECK_PYTHON=/nonexistent/python3 \
  "$ROOT/scripts/gpu_check.sh" --no-gpu --carried "$WORK/carry" --out "$WORK/logs" 2>&1 | tee "$WORK/check.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || { echo "FAIL: gpu_check.sh --no-gpu exited $rc"; exit 1; }
for s in shape_llama8b cli_generate cli_serve cli_loss shape_qwen3_4b; do
  grep -q "^| $s | passed |" "$WORK/logs/summary.md" || { echo "FAIL: step $s did not pass"; exit 1; }
done
for s in kernels engine_tp1 nccl engine_tp2; do  # the CUDA suites: every test skips here
  grep -q "^| $s | skipped | [0-9]* | [0-9]* ran: 0 passed, [1-9][0-9]* skipped, 0 failed (no CUDA device" \
    "$WORK/logs/summary.md" || { echo "FAIL: the CUDA suite $s did not skip for \"no CUDA device\""; exit 1; }
done
grep -q "^| qwen3_4b_hf | skipped |" "$WORK/logs/summary.md" || { echo "FAIL: the transformers step was not skipped"; exit 1; }
[ "$(grep -c '^| [0-9]* | \(eager\|graphs\) (off) | [0-9.]* | [0-9.]* |' "$WORK/logs/summary.md")" = 4 ] ||
  { echo "FAIL: the bench table has not 4 rows of numbers"; exit 1; }
grep -q "^loss: [0-9.]* (3 documents of 16 tokens, 45 scored, in [0-9.]* ms); [0-9.]* ms forward pass" "$WORK/logs/summary.md" ||
  { echo "FAIL: the loss row has no numbers"; exit 1; }
grep -q "^gpu check: passed" "$WORK/logs/summary.md" || { echo "FAIL: the summary does not say passed"; exit 1; }
# compare_backends can fail: a reference of another seed (another model) is outside the bound.
# (The carried binaries travel gzipped; the check unpacked them into its log folder.)
"$WORK/logs/carried-bin/compare_backends" --config "$ROOT/tests/data/fixtures/llama31/f32/config.json" --backend cpu \
  --reference cpu --seed 1 --reference-seed 2 --threads 1 >"$WORK/negative.log" 2>&1
rc=$?
[ "$rc" = 1 ] && grep -q "^result: FAIL" "$WORK/negative.log" ||
  { echo "FAIL: compare_backends passed two different models (exit $rc)"; cat "$WORK/negative.log"; exit 1; }
echo "PASS"
rm -rf "$WORK/prefix" "$WORK/carry/debs"
