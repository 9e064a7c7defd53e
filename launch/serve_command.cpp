#include "launch/serve_command.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <unistd.h>

#include <cxxopts.hpp>

#include "common/error.h"
#include "common/log.h"
#include "launch/cli_parse.h"
#include "requests/request.h"
#include "driver/job.h"
#include "parallel/comm_watch.h"
#include "launch/engine_setup.h"
#include "driver/rank_watch.h"
#include "driver/serve_loop.h"
#include "server/api_server.h"
#include "loader/chat/chat_template.h"

namespace linnet {

std::optional<ServeOptions> parse_serve_options(int argc, char** argv, std::string& help_text) {
  cxxopts::Options opts("linnet-tp serve",
                        "An OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /v1/models,\n"
                        "/health, /metrics). World rank 0 listens; the ranks of the tp group run one\n"
                        "continuous-batching engine. SIGINT/SIGTERM: stop accepting, finish what runs (up to\n"
                        "--shutdown-grace), exit 0.\n\n"
                        "  mpirun -np 2 linnet-tp serve --model DIR --port 8000\n");
  opts.custom_help("[OPTIONS]");
  // clang-format off
  opts.add_options()
    ("host", "Address to listen on", cxxopts::value<std::string>()->default_value("127.0.0.1"))
    ("port", "TCP port; 0 picks a free one (printed on stderr)", cxxopts::value<int64_t>()->default_value("8000"))
    ("api-key", "Require \"Authorization: Bearer KEY\" on /v1/ routes (default: LINNET_API_KEY; none when unset)",
     cxxopts::value<std::string>())
    ("served-model-name", "The model's name in the API (default: the model folder's name)",
     cxxopts::value<std::string>())
    ("max-queue", "Choices that may wait beyond --max-batch before new requests get 429",
     cxxopts::value<int64_t>()->default_value("256"))
    ("max-n", "Most choices per prompt (\"n\")", cxxopts::value<int64_t>()->default_value("16"))
    ("max-body-bytes", "Largest request body; larger ones get 413", cxxopts::value<int64_t>()->default_value("8388608"))
    ("max-connections", "Handler threads of POST requests: generation requests answered at once (a stream "
     "holds one while it runs; more wait for one, holding no thread)", cxxopts::value<int64_t>()->default_value("64"))
    ("max-open-connections", "Connections open at once; past it the one idle longest is closed, or the new one "
     "gets 503 when none is idle", cxxopts::value<int64_t>()->default_value("1024"))
    ("header-timeout", "Seconds from a request's first byte to the end of its header fields (408 after)",
     cxxopts::value<int64_t>()->default_value("10"))
    ("keep-alive-timeout", "Seconds a connection may stay idle before a request (closed after)",
     cxxopts::value<int64_t>()->default_value("5"))
    ("timeout", "Seconds a request body may take after its head (408 after); also the most one write of a "
     "response may wait (a stalled client is dropped and its request cancelled)",
     cxxopts::value<int64_t>()->default_value("30"))
    ("health-timeout", "/health answers 503 \"stalled\" when the engine loop has not gone round, or a rank's "
     "heartbeat has not come, for this many seconds (0: never); keep it above the longest step",
     cxxopts::value<double>()->default_value("10"))
    ("shutdown-grace", "Seconds that requests in flight may take to finish after SIGINT/SIGTERM",
     cxxopts::value<double>()->default_value("10"))
    ("h,help", "Print this help and exit");
  // clang-format on
  const EngineFlags engine_flags =
      paged_engine_flags("take the requests (each to the group with the fewest in flight)",
                         "Requests decoded together per dp group (continuous batching)");
  ServeOptions o;
  const auto parsed = parse_engine_command(opts, engine_flags, argc, argv, "serve", help_text, o.engine);
  if (!parsed) return std::nullopt;
  const cxxopts::ParseResult& r = *parsed;
  o.host = r["host"].as<std::string>();
  if (o.host.empty()) throw Error("is empty", "--host");
  read_in_range(r, "port", 0, 65535, o.port);
  if (r.count("api-key")) {
    o.api_key = r["api-key"].as<std::string>();
    if (o.api_key.empty()) throw Error("is empty", "--api-key");
  } else if (const char* k = std::getenv("LINNET_API_KEY"); k && *k) {
    o.api_key = k;
  }
  if (r.count("served-model-name")) {
    o.served_model_name = r["served-model-name"].as<std::string>();
    if (o.served_model_name.empty()) throw Error("is empty", "--served-model-name");
  }
  read_in_range(r, "max-queue", 0, int64_t{1} << 20, o.max_queue);
  read_in_range(r, "max-n", 1, 128, o.max_n);
  read_in_range(r, "max-body-bytes", 1024, int64_t{1} << 30, o.max_body_bytes);
  read_in_range(r, "max-connections", 1, 4096, o.max_connections);
  read_in_range(r, "max-open-connections", 16, 1 << 20, o.max_open_connections);
  read_in_range(r, "timeout", 1, 3600, o.timeout_s);
  read_in_range(r, "header-timeout", 1, 3600, o.header_timeout_s);
  read_in_range(r, "keep-alive-timeout", 1, 3600, o.keep_alive_timeout_s);
  o.health_timeout_s = r["health-timeout"].as<double>();
  if (!(o.health_timeout_s >= 0.0 && o.health_timeout_s <= 86400.0)) {
    throw Error("invalid value", "--health-timeout", "seconds in [0, 86400]", std::to_string(o.health_timeout_s));
  }
  o.shutdown_grace_s = r["shutdown-grace"].as<double>();
  if (!(o.shutdown_grace_s >= 0.0 && o.shutdown_grace_s <= 86400.0)) {
    throw Error("invalid value", "--shutdown-grace", "seconds in [0, 86400]", std::to_string(o.shutdown_grace_s));
  }
  return o;
}

namespace {

// The HTTP front's settings from the flags.
HttpConfig http_config(const ServeOptions& o) {
  HttpConfig hc;
  hc.host = o.host;
  hc.port = o.port;
  hc.api_key = o.api_key;
  hc.max_body_bytes = o.max_body_bytes;
  hc.threads = o.max_connections;
  hc.timeout_s = o.timeout_s;
  hc.header_timeout_s = o.header_timeout_s;
  hc.keep_alive_timeout_s = o.keep_alive_timeout_s;
  hc.max_open_connections = o.max_open_connections;
  return hc;
}

// What the API says of the model (its name, template, defaults, limits), for world rank 0's
// server. `chat` receives the chat template the server refers to.
ServedModel served_model(const ServeOptions& o, const GenerationModel& m, std::unique_ptr<ModelChatTemplate>& chat) {
  ServedModel sm;
  sm.api.tokenizer = m.tokenizer.get();
  sm.api.model_dir = m.model_dir;
  try {
    chat = std::make_unique<ModelChatTemplate>(load_chat_template(*m.tokenizer, m.model_dir));
    sm.api.chat = chat.get();
  } catch (const Error& e) {
    sm.api.chat_error = std::string("this model has no usable chat template: ") + e.what();
  }
  sm.api.served_name = o.served_model_name.empty()
                           ? std::filesystem::absolute(m.model_dir).lexically_normal().filename().string()
                           : o.served_model_name;
  if (sm.api.served_name.empty()) sm.api.served_name = m.model_dir.parent_path().filename().string();
  sm.api.defaults = m.defaults;
  sm.api.vocab_size = m.files->config.vocab_size;
  sm.limits.max_seq_len = m.max_seq_len;
  sm.limits.max_n = o.max_n;
  sm.limits.max_choices = std::max<int64_t>(o.max_n, 64);
  sm.limits.prompt_byte_limit = m.max_seq_len * prompt_bytes_per_token(*m.tokenizer);
  sm.eos = m.eos;
  return sm;
}

// A rank whose process ends (kill -9, the OOM killer) is seen within milliseconds
// (driver/rank_watch.h): world rank 0 names it and ends every open response with an
// error, another rank learns that rank 0 is gone; either exits non-zero 2 s later
// unless mpirun, which ends the job about a second after it notices, is first.
std::unique_ptr<RankWatch> watch_ranks(const WorldConfig& w, ServeHealth& health) {
  const bool root = w.world_rank == 0;
  const int me = w.world_rank;
  return std::make_unique<RankWatch>(MPI_COMM_WORLD, [&health, root, me](int, const std::string& who) {
    if (root) {
      const std::string why = who + " is gone (its process ended)";
      std::fprintf(stderr, "[linnet-tp] serve: %s: every open request ends with an error; exiting\n", why.c_str());
      health.fail(why);
    } else {
      std::fprintf(stderr, "[rank %d] serve: %s is gone (its process ended); exiting\n", me, who.c_str());
    }
    std::fflush(stderr);
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(2));  // the error responses are written
      std::_Exit(kLoadErrorExit);
    }).detach();
  });
}

}  // namespace

int run_serve(const ServeOptions& o, Job& job) {
  // --comm-timeout watches the collectives of a step; the idle waits between steps are
  // the loop's own, untimed.
  std::optional<MpiGroups> made = start_engine_run(o.engine, job);
  if (!made) return kUsageExit;
  MpiGroups& groups = *made;
  const WorldConfig& w = groups.world_config;
  install_stop_handlers();
  const bool root = w.world_rank == 0;

  // Rank 0 listens first, so /health says 503 while the model loads.
  RequestQueue queue(o.engine.max_batch * w.dp_size + o.max_queue);
  ServeMetrics metrics;
  ServeHealth health(o.health_timeout_s);
  std::unique_ptr<ApiServer> server;
  if (!job.load_phase([&] {
        if (!root) return;
        server = std::make_unique<ApiServer>(http_config(o), queue, metrics, &health);
        const int port = server->bind();
        server->start();
        std::fprintf(stderr, "[linnet-tp] serve: listening on http://%s:%d (pid %d, loading the model)\n", o.host.c_str(),
                     port, static_cast<int>(::getpid()));
      })) {
    return kLoadErrorExit;
  }

  GenerationModel m;
  OpenedEngine e;
  DraftModel draft;  // --speculative-config's draft_model
  const bool loaded = job.load_phase([&] {
    m = open_generation_model(o.engine, w, {});  // requests set their own sampling
    e = open_engine(o.engine, m.files->config, m.files.get(), m.plan, groups,
                    {EngineSizing::Kv::kPaged, m.max_seq_len, o.engine.max_batch});
    report_engine(o.engine, e, *m.files, m.plan, m.max_seq_len, o.engine.max_batch, w);
    if (o.engine.speculative.method == "draft_model") draft = open_draft_model(o.engine, m, e, groups, o.engine.max_batch);
  });
  if (!loaded) {
    if (server) server->stop();
    return kLoadErrorExit;
  }

  std::unique_ptr<ModelChatTemplate> chat;
  if (root) {
    ServedModel sm = served_model(o, m, chat);
    const std::string name = sm.api.served_name;
    server->ready(std::move(sm));
    std::fprintf(stderr,
                 "[linnet-tp] serve: ready, model \"%s\", %d dp group(s) x tp %d, up to %lld requests at once per "
                 "group, %lld KV pages per group\n",
                 name.c_str(), w.dp_size, w.tp_size, static_cast<long long>(o.engine.max_batch),
                 static_cast<long long>(e.engine->num_pages()));
  }

  std::unique_ptr<RankWatch> watch;
  try {
    watch = watch_ranks(w, health);
  } catch (const std::exception& ex) {
    job.abort(ex.what());
  }

  try {
    ServeLoopConfig lc;
    lc.groups = &groups;
    lc.tokenizer = m.tokenizer.get();
    lc.queue = &queue;
    lc.metrics = &metrics;
    lc.health = root ? &health : nullptr;
    lc.on_drain = [&] {
      if (server) server->drain();
      std::fprintf(stderr, "[linnet-tp] serve: stopping (new requests get 503; up to %g s for those running)\n",
                   o.shutdown_grace_s);
    };
    lc.shutdown_grace_s = o.shutdown_grace_s;
    lc.prefix_caching = o.engine.prefix_caching;
    lc.speculative = o.engine.speculative;
    lc.draft = draft.engine.get();
    run_serve_loop(*e.engine, lc);
    // Every request has ended in the engine; let their responses finish writing.
    if (server) server->stop(std::chrono::milliseconds(static_cast<int64_t>(1000.0 * std::min(o.shutdown_grace_s, 5.0) + 1000)));
  } catch (const std::exception& e) {
    job.abort(e.what());
  }
  if (root) std::fprintf(stderr, "[linnet-tp] serve: stopped\n");
  return kOkExit;
}

}  // namespace linnet
