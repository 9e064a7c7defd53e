// Which instruction-set path the CPU kernels take: detected once from CPUID, or forced
// with LINNET_CPU_ISA=generic|avx2 (for tests and A/B runs). avx512 is recognised and
// refused until its path exists (this project's machines are Zen 1: no AVX-512 to test on).
#pragma once

#include <string>

namespace linnet::cpu {

/// The kernel paths. kGeneric is portable C++ (the compiler may vectorize it); kAvx2
/// needs AVX2 + FMA + F16C.
enum class Isa { kGeneric, kAvx2 };

/// "generic" or "avx2".
const char* isa_name(Isa isa);

/// True when this CPU can run `isa`'s path.
bool isa_supported(Isa isa);

/// The path in use: LINNET_CPU_ISA when set (read once), else the best this CPU runs.
/// @throws Error when LINNET_CPU_ISA names an unknown path, one not built (avx512), or
///   one this CPU cannot run.
Isa active_isa();

/// Forces `isa` for later kernel calls (tests run every path the machine can run).
/// @throws Error when this CPU cannot run it.
void set_isa(Isa isa);

}  // namespace linnet::cpu
