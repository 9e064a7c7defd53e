#include "kernels/cpu/threads.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <omp.h>

namespace linnet::cpu {
namespace {
int g_threads = 1;

bool pin_to(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0;  // 0: the calling thread
}
}  // namespace

void set_num_threads(int n) {
  g_threads = std::max(1, n);
  omp_set_num_threads(g_threads);
}

int num_threads() { return g_threads; }

int threads_for(int64_t work) { return work < (int64_t{1} << 15) ? 1 : g_threads; }

std::vector<int> core_share(int local_rank, int local_size, int cores) {
  cores = std::max(1, cores);
  local_size = std::max(1, local_size);
  std::vector<int> out;
  if (local_size >= cores) {
    out.push_back(local_rank % cores);
    return out;
  }
  const int begin = local_rank * cores / local_size, end = (local_rank + 1) * cores / local_size;
  for (int c = begin; c < end; ++c) out.push_back(c);
  return out;
}

Placement pin_threads(int local_rank, int local_size) {
  Placement out;  // strings built by append: GCC 12 warns falsely on "literal" + std::string
  const char* env = std::getenv("LINNET_PIN");
  if (env && std::strcmp(env, "0") == 0) {
    out.where = "not pinned (LINNET_PIN=0)";
    return out;
  }
  const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const std::vector<int> share = core_share(local_rank, local_size, cores);
  cpu_set_t before;
  CPU_ZERO(&before);
  const int launcher_cores = sched_getaffinity(0, sizeof before, &before) == 0 ? CPU_COUNT(&before) : cores;
  if (launcher_cores < g_threads) {
    // libgomp read the launcher's mask at start-up and waits on futexes (not spinning)
    // when it has more threads than cores it saw: every parallel region then pays a
    // wake-up. Say so; the fix is the launcher's.
    out.launcher_warning.append("the launcher had bound this rank to ")
        .append(std::to_string(launcher_cores))
        .append(launcher_cores == 1 ? " core" : " cores")
        .append(", which slows OpenMP here: run mpirun with --bind-to none (scripts/mpirun.sh does)");
  }
  // The whole process first (threads made later inherit it), then each OpenMP thread.
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : share) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    out.where.append("not pinned: ").append(std::strerror(errno));
    return out;
  }
  bool ok = true;
#pragma omp parallel num_threads(g_threads) reduction(&& : ok)
  ok = pin_to(share[static_cast<size_t>(omp_get_thread_num()) % share.size()]);
  out.where.append(share.size() > 1 ? "cores " : "core ").append(std::to_string(share.front()));
  if (share.size() > 1) out.where.append("-").append(std::to_string(share.back()));
  if (!ok) out.where.append(" (some threads could not be pinned)");
  return out;
}

}  // namespace linnet::cpu
