// The machine's two limits that bound the decoder on the CPU, measured the way STREAM
// and the classic peak-FLOP loops measure them, so benchmarks can state each figure as
// a fraction of the one that binds: DRAM read bandwidth (decode at small batch reads
// every weight once a step) and f32 fused-multiply-add peak (prefill and large batches).
#pragma once

namespace linnet::cpu {

/// Read bandwidth in GB/s (1e9 bytes/s) of `threads` threads summing disjoint parts of
/// a 1 GiB f32 array (vector loads), best of 8 passes: half of them read 8 far-apart
/// streams a thread, half one (which pattern a core's prefetchers serve best differs
/// between CPUs; roofline.cpp). Each thread is
/// an OpenMP thread of the rank's team (pinned where threads.h pinned them).
double dram_read_gbps(int threads);

/// f32 multiply-add peak in GFLOP/s (2 flops per fma lane) of `threads` threads, each
/// running 12 independent register-only fma chains on the widest vectors the active
/// ISA path uses (zmm, ymm, or scalar for generic), best of 3 runs.
double fma_peak_gflops(int threads);

}  // namespace linnet::cpu
