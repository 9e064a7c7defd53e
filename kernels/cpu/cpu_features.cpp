#include "kernels/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "common/error.h"

namespace linnet::cpu {
namespace {

std::atomic<int> g_isa{-1};
std::once_flag g_once;

Isa detect() {
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kGeneric;
}

}  // namespace

const char* isa_name(Isa isa) {
  return isa == Isa::kAvx512 ? "avx512" : isa == Isa::kAvx2 ? "avx2" : "generic";
}

bool isa_supported(Isa isa) {
  if (isa == Isa::kGeneric) return true;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return isa == Isa::kAvx2 ? avx2 : avx2 && __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

void set_isa(Isa isa) {
  if (!isa_supported(isa)) throw Error("this CPU cannot run the kernel path", "set_isa", "a supported path", isa_name(isa));
  std::call_once(g_once, [] {});
  g_isa.store(static_cast<int>(isa));
}

Isa active_isa() {
  std::call_once(g_once, [] {
    const char* env = std::getenv("LINNET_CPU_ISA");
    const std::string want = env ? env : "";
    Isa isa = detect();
    if (want == "generic") {
      isa = Isa::kGeneric;
    } else if (want == "avx2") {
      if (!isa_supported(Isa::kAvx2)) {
        throw Error("this CPU lacks AVX2 + FMA + F16C", "LINNET_CPU_ISA", "generic (or unset)", want);
      }
      isa = Isa::kAvx2;
    } else if (want == "avx512") {
      if (!isa_supported(Isa::kAvx512)) {
        throw Error("this CPU lacks AVX-512F", "LINNET_CPU_ISA", "generic, avx2 (where supported) or unset", want);
      }
      isa = Isa::kAvx512;
    } else if (!want.empty()) {
      throw Error("unknown kernel path", "LINNET_CPU_ISA", "generic, avx2, avx512 or unset", want);
    }
    g_isa.store(static_cast<int>(isa));
  });
  return static_cast<Isa>(g_isa.load());
}

}  // namespace linnet::cpu
