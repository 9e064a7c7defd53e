#include "common/stop_signal.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>

namespace linnet {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
char g_stop_note[2048];
volatile std::sig_atomic_t g_stop_note_bytes = 0;

extern "C" void on_stop_signal(int sig) {
  const bool first = g_stop_signal == 0;
  g_stop_signal = sig;
  // A second signal of this kind ends the process the default way.
  std::signal(sig, SIG_DFL);
  if (first && g_stop_note_bytes > 0) {
    const ssize_t n = ::write(STDERR_FILENO, g_stop_note, static_cast<size_t>(g_stop_note_bytes));
    (void)n;
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (const int sig : {SIGINT, SIGTERM, SIGUSR1}) {
    // A signal already caught has its default action back (a second one ends the run).
    if (g_stop_signal != sig) sigaction(sig, &sa, nullptr);
  }
}

void release_stop_handlers() {
  for (const int sig : {SIGINT, SIGTERM, SIGUSR1}) std::signal(sig, SIG_DFL);
  if (const int sig = g_stop_signal; sig != 0) std::raise(sig);  // caught during start-up
}

void set_stop_note(const std::string& note) {
  g_stop_note_bytes = 0;  // a handler running now sees no half-written note
  const size_t n = std::min(note.size(), sizeof g_stop_note);
  std::memcpy(g_stop_note, note.data(), n);
  g_stop_note_bytes = static_cast<std::sig_atomic_t>(n);
}

int caught_stop_signal() { return static_cast<int>(g_stop_signal); }

}  // namespace linnet
