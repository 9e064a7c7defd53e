#include "common/log.h"

#include <cstdio>

namespace linnet {
namespace {
int g_rank = -1;
bool g_verbose = false;

void emit(const char* kind, const std::string& msg, bool prefix = true) {
  std::string line;
  if (prefix && g_rank >= 0) line += "[rank " + std::to_string(g_rank) + "] ";
  line += kind;
  line += msg;
  line += '\n';
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}
}  // namespace

void set_log_rank(int rank) { g_rank = rank; }
int log_rank() { return g_rank; }
void set_verbose(bool on) { g_verbose = on; }
bool verbose() { return g_verbose; }
void warn(const std::string& msg) { emit("warning: ", msg); }
void warn_once(const std::string& msg) { emit("warning: ", msg, /*prefix=*/false); }
void info(const std::string& msg) {
  if (g_verbose) emit("", msg);
}
}  // namespace linnet
