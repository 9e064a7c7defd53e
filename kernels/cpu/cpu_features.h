// Which instruction-set path the CPU kernels take: detected once from CPUID (the best
// this CPU runs), or forced with LINNET_CPU_ISA=generic|avx2|avx512 (for tests and A/B
// runs).
#pragma once

#include <string>

namespace linnet::cpu {

/// The kernel paths. kGeneric is portable C++ (the compiler may vectorize it); kAvx2
/// needs AVX2 + FMA + F16C; kAvx512 needs AVX-512F (+ FMA, F16C).
enum class Isa { kGeneric, kAvx2, kAvx512 };

/// "generic", "avx2" or "avx512".
const char* isa_name(Isa isa);

/// True when this CPU can run `isa`'s path.
bool isa_supported(Isa isa);

/// The path in use: LINNET_CPU_ISA when set (read once), else the best this CPU runs.
/// @throws Error when LINNET_CPU_ISA names an unknown path or one this CPU cannot run.
Isa active_isa();

/// Forces `isa` for later kernel calls (tests run every path the machine can run).
/// @throws Error when this CPU cannot run it.
void set_isa(Isa isa);

}  // namespace linnet::cpu
