// linnet-tp: the executable. Initializes MPI and the watch over waits for other ranks
// (parallel/comm_watch.h), parses the command line, runs the subcommand, and makes every
// rank exit non-zero together on an error (driver/job.h).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "launch/bench_command.h"
#include "launch/cli_options.h"
#include "launch/generate_command.h"
#include "launch/info_command.h"
#include "launch/loss_command.h"
#include "driver/job.h"
#include "launch/serve_command.h"
#include "parallel/comm_watch.h"

#ifndef LINNET_VERSION
#define LINNET_VERSION "unknown"
#endif

namespace {
// Started without a launcher (a singleton: `linnet-tp --prompt ...` typed directly), Open
// MPI 4's MPI_Init forks a local daemon whose process launcher looks for ssh / rsh and
// aborts the start when neither exists, as in many containers. A singleton never starts
// processes on other hosts, so the "isolated" launcher (local processes only) is all it
// needs. Only when no launcher started us (Open MPI's, PMIx's or PMI's rank variables
// unset) and the user chose no launcher component (OMPI_MCA_plm unset).
void prefer_isolated_singleton_start() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "OMPI_MCA_plm"}) {
    if (std::getenv(v) != nullptr) return;
  }
  ::setenv("OMPI_MCA_plm", "isolated", 0);
}
}  // namespace

int main(int argc, char** argv) {
  prefer_isolated_singleton_start();
  // serve's HTTP threads never call MPI: only the main thread does (FUNNELED).
  // A stop signal during start-up is recorded, not fatal (driver/job.h).
  linnet::install_stop_handlers();
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  linnet::init_comm_watch(MPI_COMM_WORLD);
  int code = 0;
  {
    linnet::Job job(MPI_COMM_WORLD);
    linnet::CommandLine cl;
    // Every rank parses the same argv, so a usage error is the same everywhere.
    try {
      const bool parsed = job.load_phase([&] { cl = linnet::parse_command_line(argc, argv); });
      // Only generate --input, loss and serve stop gracefully on a signal.
      using Kind = linnet::CommandLine::Kind;
      if (!parsed || (cl.kind != Kind::kLoss && cl.kind != Kind::kServe && cl.kind != Kind::kGenerate)) {
        linnet::release_stop_handlers();
      }
      if (!parsed) {
        code = linnet::kUsageExit;
      } else if (cl.kind == linnet::CommandLine::Kind::kHelp) {
        if (job.rank() == 0) std::fputs(cl.help_text.c_str(), stdout);
      } else if (cl.kind == linnet::CommandLine::Kind::kVersion) {
        if (job.rank() == 0) std::printf("linnet-tp %s\n", LINNET_VERSION);
      } else if (cl.kind == linnet::CommandLine::Kind::kLoss) {
        code = linnet::run_loss(cl.loss, job);
      } else if (cl.kind == linnet::CommandLine::Kind::kServe) {
        code = linnet::run_serve(cl.serve, job);
      } else if (cl.kind == linnet::CommandLine::Kind::kBench) {
        code = linnet::run_bench(cl.bench, job);
      } else if (cl.kind == linnet::CommandLine::Kind::kInfo) {
        code = linnet::run_info(cl.info, job);
      } else if (cl.kind == linnet::CommandLine::Kind::kTemplate) {
        code = linnet::run_template(cl.chat_template, job);
      } else if (cl.kind == linnet::CommandLine::Kind::kTokenize) {
        code = linnet::run_tokenize(cl.tokenize, job);
      } else {
        code = linnet::run_generate(cl.generate, job);
      }
    } catch (const std::exception& e) {
      // A collective outside the subcommands' own handlers (a timeout while the lines
      // are broadcast, say): end the job the same way.
      job.abort(e.what());
    }
  }
  linnet::finalize_comm_watch();
  MPI_Finalize();
  return code;
}
