#include "server/api_server.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <signal.h>

#include <cctype>
#include <ctime>
#include <optional>
#include <random>

#include <httplib.h>

#include "common/error.h"
#include "server/http/http_front.h"
#include "common/stop_signal.h"

namespace linnet {

using nlohmann::ordered_json;

struct ApiServerState {
  HttpConfig config;
  RequestQueue& queue;
  ServeMetrics& metrics;
  std::atomic<bool>& draining;
  const ServeHealth* health = nullptr;
  std::function<int64_t()> open_connections;
  std::mutex mutex;
  std::shared_ptr<const ServedModel> model;  // set once ready
  std::atomic<int64_t> open_responses{0};    // generation responses not yet released

  std::shared_ptr<const ServedModel> served() {
    std::lock_guard<std::mutex> lock(mutex);
    return model;
  }
  // A stop signal was caught (by this process's handler at once, or passed on by
  // another rank once the engine loop has seen it).
  bool stopping() const { return draining || caught_stop_signal() != 0; }
};

namespace {

// Reads a POST body into `body`, whatever its Content-Type (curl -d sends a form type,
// whose body httplib would cap at 8 KiB), counting bytes as they come so that a chunked
// body stops being read once it passes --max-body-bytes. The error to answer, if any.
std::optional<ApiError> read_body(int64_t max_body_bytes, const httplib::Request& hreq, httplib::Response& res,
                                  const httplib::ContentReader& reader, std::string& body) {
  bool too_large = false;
  if (hreq.is_multipart_form_data()) {
    // Read as it is, not split into parts (the request object is httplib's own, not const).
    const_cast<httplib::Request&>(hreq).headers.erase("Content-Type");
  }
  const bool read = reader([&](const char* data, size_t n) {
    if (static_cast<int64_t>(body.size() + n) > max_body_bytes) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (too_large || res.status == 413) {
    return ApiError(413, "the request body is larger than " + std::to_string(max_body_bytes) + " bytes");
  }
  if (!read) return ApiError(400, "malformed or incomplete request body");
  return std::nullopt;
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  res.set_content(dump_json(e.body()), "application/json");
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx%08llx", prefix, static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffull));
  return buf;
}

uint64_t random_seed() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

// One generation request as its response is written: the choices' tokens, text and
// outcome as the channel brings them.
struct Generation {
  struct Choice {
    const Request* request = nullptr;        // its prompt (ApiRequest::prompts)
    size_t prompt = 0;                       // index in ApiRequest::prompts
    std::string shown;                       // the completion as it may be shown so far (the events' text)
    bool stopped = false;                    // a stop string ended it
    std::vector<int32_t> ids;
    std::vector<TokenLogprobs> lps;
    std::vector<double> prompt_lps;
    std::vector<std::vector<std::pair<int32_t, float>>> prompt_top;
    bool has_prompt_lps = false;
    std::unique_ptr<TextOffsets> offsets;    // streamed completions logprobs: text_offset across the chunks
    std::vector<size_t> offset_of;           // each new token's text_offset, placed as it came
    size_t lp_sent = 0;                      // streamed completions: tokens whose logprobs went out
    std::string finish, error;
    bool done = false, started = false;
  };
  ApiRequest req;
  std::shared_ptr<const ServedModel> model;
  std::shared_ptr<ServeChannel> channel;
  ServeMetrics* metrics = nullptr;
  RequestQueue* queue = nullptr;
  std::string id;
  int64_t created = 0;
  std::vector<Choice> choices;
  size_t done = 0;
  bool failed = false;
  bool complete = false;  // the whole response was written
  std::atomic<int64_t>* open = nullptr;
  const ServeHealth* health = nullptr;  // its failure() ends the open choices with an error
  bool failed_server = false;           // they were ended so

  const Tokenizer& tok() const { return *model->api.tokenizer; }

  // The server failed (a rank's process ended): every choice not done ends with an error
  // naming it, in the events this turn applies (a stream: an error event, then [DONE];
  // otherwise the error object is the body).
  void end_open_choices(std::vector<ServeEvent>& events) {
    if (failed_server || !health) return;
    const std::string why = health->failure();
    if (why.empty()) return;
    failed_server = true;
    for (size_t i = 0; i < choices.size(); ++i) {
      if (choices[i].done) continue;
      ServeEvent e;
      e.kind = ServeEvent::Kind::kDone;
      e.choice = static_cast<int>(i);
      e.finish_reason = "error";
      e.error = "the server failed: " + why;
      events.push_back(std::move(e));
    }
  }

  ordered_json chunk_base() const {
    ordered_json j;
    j["id"] = id;
    j["object"] = req.chat ? "chat.completion.chunk" : "text_completion";
    j["created"] = created;
    j["model"] = model->api.served_name;
    return j;
  }

  // Characters of the echoed prompt text in the returned text (0 without echo).
  size_t prompt_chars(const Choice& c) const { return req.echo ? utf8_chars(c.request->text) : 0; }
  std::unique_ptr<TextOffsets> make_offsets(const Choice& c) const {
    return std::make_unique<TextOffsets>(tok(), c.request->ids, req.echo, prompt_chars(c));
  }

  std::string finish_reason(const Choice& c) const {
    return c.stopped && c.finish == "length" ? std::string("stop") : c.finish;
  }

  // Applies events; for streaming, returns the SSE frames they give.
  std::string apply(std::vector<ServeEvent>& events) {
    std::map<int, std::pair<std::string, std::vector<size_t>>> delta;  // choice: text, new token positions
    std::vector<int> finished;
    for (ServeEvent& e : events) {
      Choice& c = choices.at(static_cast<size_t>(e.choice));
      if (c.done) continue;  // ended already (the server failed): what the engine still sends is dropped
      if (e.kind == ServeEvent::Kind::kPromptLogprobs) {
        c.prompt_lps = std::move(e.prompt_logprobs);
        c.prompt_top = std::move(e.prompt_top);
        c.has_prompt_lps = true;
      } else if (e.kind == ServeEvent::Kind::kToken) {
        c.ids.push_back(e.token);
        if (req.stream && !req.chat && req.logprobs >= 0) {
          if (!c.offsets) c.offsets = make_offsets(c);
          c.offset_of.push_back(c.offsets->completion(e.token));
        }
        if (e.logprobs) c.lps.push_back(std::move(*e.logprobs));
        c.shown += e.text;
        auto& d = delta[e.choice];
        d.first += e.text;
        d.second.push_back(c.ids.size() - 1);
      } else {
        c.finish = e.finish_reason;
        c.error = e.error;
        c.done = true;
        ++done;
        if (c.finish == "error" || c.finish == "cancelled") failed = true;
        c.stopped = e.stopped;
        c.shown += e.text;
        delta[e.choice].first += e.text;
        finished.push_back(e.choice);
      }
    }
    if (!req.stream) return {};
    std::string out;
    for (auto& [i, d] : delta) {
      Choice& c = choices[static_cast<size_t>(i)];
      const bool ends = std::find(finished.begin(), finished.end(), i) != finished.end();
      if (ends && (c.finish == "error" || c.finish == "cancelled")) {
        out += sse_frame(ApiError(c.finish == "error" ? 500 : 503, c.error.empty() ? c.finish : c.error).body());
        continue;
      }
      out += stream_chunk(c, static_cast<size_t>(i), d.first, d.second, ends);
    }
    return out;
  }

  std::string stream_chunk(Choice& c, size_t index, const std::string& text, const std::vector<size_t>& tokens,
                           bool ends) {
    std::string out;
    ordered_json j = chunk_base();
    ordered_json choice;
    choice["index"] = index;
    if (req.chat) {
      if (!c.started) {  // the first chunk of a chat choice names the role
        ordered_json first = j;
        ordered_json ch = {{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                           {"logprobs", nullptr}, {"finish_reason", nullptr}};
        first["choices"] = ordered_json::array({ch});
        if (req.include_usage) first["usage"] = nullptr;
        out += sse_frame(first);
        c.started = true;
      }
      choice["delta"] = text.empty() ? ordered_json::object() : ordered_json{{"content", text}};
    } else {
      std::string shown = text;
      bool echo_now = req.echo && !c.started;
      if (echo_now) shown = c.request->text + shown;
      c.started = true;
      choice["text"] = shown;
      (void)echo_now;
    }
    ordered_json lp = nullptr;
    if (req.logprobs >= 0) {
      std::vector<int32_t> ids;
      std::vector<TokenLogprobs> lps;
      std::vector<size_t> at;
      if (req.chat) {
        for (size_t k : tokens) {
          if (k < c.lps.size()) {
            ids.push_back(c.ids[k]);
            lps.push_back(c.lps[k]);
          }
        }
      } else {
        // A token's logprobs go out with the text at its text_offset: while text is held
        // back (it could start a stop string) so are the tokens placed in it, and a stop
        // string that cuts the text caps their offsets at its end, as the whole response
        // does (they used to go out with offsets past a text cut later).
        const size_t shown = prompt_chars(c) + utf8_chars(c.shown);
        while (c.lp_sent < c.lps.size() && c.lp_sent < c.offset_of.size() &&
               (ends || c.offset_of[c.lp_sent] < shown)) {
          ids.push_back(c.ids[c.lp_sent]);
          lps.push_back(c.lps[c.lp_sent]);
          at.push_back(std::min(c.offset_of[c.lp_sent], shown));
          ++c.lp_sent;
        }
      }
      if (req.chat) {
        if (!ids.empty()) lp = chat_logprobs(tok(), ids, lps, req.logprobs);
      } else if (!ids.empty() || (req.echo && c.has_prompt_lps)) {
        const bool with_prompt = req.echo && c.has_prompt_lps;
        if (!c.offsets) c.offsets = make_offsets(c);
        lp = completion_logprobs(tok(), c.request->ids, with_prompt ? &c.prompt_lps : nullptr,
                                 with_prompt ? &c.prompt_top : nullptr, ids, lps, req.logprobs, *c.offsets, &at);
        c.has_prompt_lps = false;  // sent once
      }
    }
    choice["logprobs"] = lp;
    choice["finish_reason"] = ends ? ordered_json(finish_reason(c)) : ordered_json();
    if (!ends && text.empty() && lp.is_null() && !(req.echo && !req.chat)) return out;
    j["choices"] = ordered_json::array({choice});
    if (req.include_usage) j["usage"] = nullptr;
    out += sse_frame(j);
    return out;
  }

  int64_t prompt_tokens() const {
    int64_t n = 0;
    for (const Request& r : req.prompts) n += static_cast<int64_t>(r.ids.size());
    return n;
  }
  int64_t completion_tokens() const {
    int64_t n = 0;
    for (const Choice& c : choices) n += static_cast<int64_t>(c.ids.size());
    return n;
  }

  // The end of a stream: the usage chunk when asked for, then [DONE].
  std::string stream_end() const {
    std::string out;
    if (req.include_usage) {
      ordered_json j = chunk_base();
      j["choices"] = ordered_json::array();
      j["usage"] = usage_json(prompt_tokens(), completion_tokens());
      out += sse_frame(j);
    }
    return out + "data: [DONE]\n\n";
  }

  // The whole non-streaming response.
  std::string body() const {
    for (const Choice& c : choices) {
      if (c.finish == "error" || c.finish == "cancelled") {
        return dump_json(ApiError(c.finish == "error" ? 500 : 503, c.error.empty() ? c.finish : c.error).body());
      }
    }
    ordered_json j;
    j["id"] = id;
    j["object"] = req.chat ? "chat.completion" : "text_completion";
    j["created"] = created;
    j["model"] = model->api.served_name;
    ordered_json list = ordered_json::array();
    for (size_t i = 0; i < choices.size(); ++i) {
      const Choice& c = choices[i];
      ordered_json ch;
      ch["index"] = i;
      if (req.chat) {
        ch["message"] = {{"role", "assistant"}, {"content", c.shown}};
        ch["logprobs"] = req.logprobs >= 0 ? chat_logprobs(tok(), c.ids, c.lps, req.logprobs) : ordered_json();
      } else {
        ch["text"] = (req.echo ? c.request->text : std::string()) + c.shown;
        if (req.logprobs >= 0) {
          std::unique_ptr<TextOffsets> offsets = make_offsets(c);
          offsets->cap(prompt_chars(c) + utf8_chars(c.shown));
          ch["logprobs"] = completion_logprobs(tok(), c.request->ids, req.echo ? &c.prompt_lps : nullptr,
                                               req.echo ? &c.prompt_top : nullptr, c.ids, c.lps, req.logprobs,
                                               *offsets);
        } else {
          ch["logprobs"] = ordered_json();
        }
      }
      ch["finish_reason"] = finish_reason(c);
      list.push_back(std::move(ch));
    }
    j["choices"] = std::move(list);
    j["usage"] = usage_json(prompt_tokens(), completion_tokens());
    return dump_json(j);
  }
};

}  // namespace

namespace {

// Room in RLIMIT_NOFILE for `open` connections besides the process's other files: the
// soft limit is raised up to the hard one when needed; returns how many fit.
int64_t fit_open_files(int64_t open) {
  constexpr int64_t kOtherFiles = 256;  // MPI, model files, handler threads' pipes
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return open;
  const rlim_t want = static_cast<rlim_t>(open + kOtherFiles);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want) return open;
  return std::max<int64_t>(16, static_cast<int64_t>(rl.rlim_cur) - kOtherFiles);
}

// --- the routes: one function each, over the server's state ---------------------------

// Authentication of the API routes (pre-routing): the key is compared in constant time.
httplib::Server::HandlerResponse check_api_key(ApiServerState& st, const httplib::Request& req,
                                               httplib::Response& res) {
  const bool api = req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
  if (st.config.api_key.empty() || !api) return httplib::Server::HandlerResponse::Unhandled;
  const std::string auth = req.get_header_value("Authorization");
  // The scheme is case-insensitive (RFC 7235: "bearer KEY" is as good).
  const std::string prefix = "bearer ";
  bool scheme = auth.size() > prefix.size();
  for (size_t i = 0; scheme && i < prefix.size(); ++i) {
    scheme = std::tolower(static_cast<unsigned char>(auth[i])) == prefix[i];
  }
  const bool ok = scheme && constant_time_equal(auth.substr(prefix.size()), st.config.api_key);
  if (ok) return httplib::Server::HandlerResponse::Unhandled;
  send_error(res, ApiError(401, "missing or wrong API key (give \"Authorization: Bearer KEY\")", "", "",
                           "invalid_api_key"));
  return httplib::Server::HandlerResponse::Handled;
}

// httplib's own refusals (413 body too large, 404 no route, 400 bad request line) carry
// OpenAI's error object too; a route that exists with another method answers 405.
httplib::Server::HandlerResponse answer_http_error(ApiServerState& st, const httplib::Request& req,
                                                   httplib::Response& res) {
  if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
  std::string message = "HTTP " + std::to_string(res.status);
  if (res.status == 404) {
    message = "no such route";
    // A route that exists with another method: 405 naming the one it takes.
    static const std::vector<std::pair<std::string, std::string>> routes = {
        {"/health", "GET"}, {"/metrics", "GET"}, {"/v1/models", "GET"},
        {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/tokenize", "POST"},
        {"/detokenize", "POST"}};
    for (const auto& [path, method] : routes) {
      if (req.path == path) {
        res.status = 405;
        res.set_header("Allow", method == "GET" ? "GET, HEAD" : method);
        message = req.method + " is not allowed on " + path + " (use " + method + ")";
      }
    }
  }
  if (res.status == 413) {
    message = "the request body is larger than " + std::to_string(st.config.max_body_bytes) + " bytes";
  }
  if (res.status == 400) message = "malformed HTTP request";
  send_error(res, ApiError(res.status, message));
  return httplib::Server::HandlerResponse::Handled;
}

// An exception a handler let out: 500 with its message.
void answer_exception(httplib::Response& res, std::exception_ptr ep) {
  std::string what = "unknown";
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  send_error(res, ApiError(500, "internal error: " + what));
}

// GET /health: failed, shutting down, stalled, loading or ok.
void get_health(ApiServerState& st, httplib::Response& res) {
  const bool ready = st.served() != nullptr;
  if (const std::string f = st.health ? st.health->failure() : std::string(); !f.empty()) {
    res.status = 503;
    res.set_content(dump_json({{"status", "failed"}, {"reason", f}}), "application/json");
    return;
  }
  if (st.stopping()) {  // a load balancer takes this rank out while it drains
    res.status = 503;
    res.set_content("{\"status\":\"shutting down\"}", "application/json");
    return;
  }
  if (ready && st.health) {
    const std::string problem = st.health->problem(std::chrono::steady_clock::now());
    if (!problem.empty()) {
      res.status = 503;
      res.set_content(dump_json({{"status", "stalled"}, {"reason", problem}}), "application/json");
      return;
    }
  }
  res.status = ready ? 200 : 503;
  res.set_content(ready ? "{\"status\":\"ok\"}" : "{\"status\":\"loading\"}", "application/json");
}

// GET /metrics: Prometheus text.
void get_metrics(ApiServerState& st, httplib::Response& res) {
  if (st.open_connections) st.metrics.http_connections(st.open_connections());
  res.set_content(st.metrics.render(), "text/plain; version=0.0.4");
}

// GET /v1/models: the one model served.
void get_models(ApiServerState& st, httplib::Response& res) {
  const auto model = st.served();
  if (!model) return send_error(res, ApiError(503, "the model is still loading"));
  ordered_json m;
  m["id"] = model->api.served_name;
  m["object"] = "model";
  m["created"] = static_cast<int64_t>(std::time(nullptr));
  m["owned_by"] = "linnet-tp";
  m["max_model_len"] = model->limits.max_seq_len;
  res.set_content(dump_json({{"object", "list"}, {"data", ordered_json::array({m})}}), "application/json");
}

// POST /tokenize, /detokenize (vLLM's tokenizer endpoints, which evaluation harnesses
// probe for): the tokenizer on the HTTP thread, no engine; the API key, the body limit
// and the prompt limits as for the generation routes.
void post_tokenizer_tool(ApiServerState& st, std::string (*fn)(const std::string&, const ApiModel&, const ApiLimits&),
                         const httplib::Request& hreq, httplib::Response& res, const httplib::ContentReader& reader) {
  std::string body;
  if (const std::optional<ApiError> e = read_body(st.config.max_body_bytes, hreq, res, reader, body)) {
    return send_error(res, *e);
  }
  const auto model = st.served();
  if (!model) return send_error(res, ApiError(503, "the model is still loading"));
  try {
    res.set_content(fn(body, model->api, model->limits), "application/json");
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

// The choices of a parsed generation request (n per prompt; choice k > 0 of a prompt
// waits for the pages of its first), and the response's record of each.
std::vector<ServeChoice> make_choices(Generation& g, const ServedModel& model) {
  std::vector<ServeChoice> choices;
  for (size_t p = 0; p < g.req.prompts.size(); ++p) {
    for (int64_t k = 0; k < g.req.n; ++k) {
      const Request& r = g.req.prompts[p];
      ServeChoice c;
      c.request = r;
      const uint64_t seed = g.req.seed ? *g.req.seed + static_cast<uint64_t>(k) : random_seed();
      c.batch = batch_request(r, model.eos, seed);
      c.score_prompt = g.req.echo && g.req.logprobs >= 0;
      c.after = k > 0 ? static_cast<int>(choices.size() - static_cast<size_t>(k)) : -1;
      choices.push_back(std::move(c));
      Generation::Choice gc;
      gc.request = &r;
      gc.prompt = p;
      g.choices.push_back(std::move(gc));
    }
  }
  return choices;
}

// Submits `choices` to the engine loop and waits for it to take them in. The error to
// answer when it does not (too many choices, queue full, shutting down, a stuck step).
std::optional<ApiError> submit(ApiServerState& st, Generation& g, std::vector<ServeChoice> choices) {
  const RequestQueue::Admit admit = st.queue.submit(std::move(choices), g.channel);
  if (admit == RequestQueue::Admit::kTooMany) {
    return ApiError(400,
                    "n x prompts = " + std::to_string(g.choices.size()) +
                        " choices can never fit: the server holds at most " + std::to_string(st.queue.capacity()) +
                        " (--max-batch x dp + --max-queue)",
                    "n");
  }
  if (admit == RequestQueue::Admit::kFull) return ApiError(429, "the server's queue is full; retry later", "", "", "queue_full");
  if (admit == RequestQueue::Admit::kClosed) return ApiError(503, "the server is shutting down");
  // The engine loop takes the submission in at its next turn (within a step), or
  // refuses it once a stop signal was caught; the status is sent only after that.
  const ServeChannel::Admission admission = g.channel->wait_admission(std::chrono::milliseconds(1000 * st.config.timeout_s));
  if (admission == ServeChannel::Admission::kAdmitted) return std::nullopt;
  if (admission == ServeChannel::Admission::kRefused) return ApiError(503, "the server is shutting down");
  g.channel->abandon();  // taken later, it is cancelled before it starts
  st.queue.notify();
  return ApiError(503, "the engine did not take the request in within " + std::to_string(st.config.timeout_s) +
                           " s (is a step stuck?)");
}

// The response is written as the tokens come; the client leaving (httplib tests the
// socket between calls) or a failed write ends it, and the releaser abandons the channel
// so the engine cancels what is left.
void respond_as_tokens_come(std::shared_ptr<Generation> g, httplib::Response& res) {
  auto provider = [g](size_t, httplib::DataSink& sink) {
    // A closed socket (the peer's FIN, seen by a peek) ends the response even while
    // nothing is written (a non-streaming request waits without writing).
    if (!sink.is_writable()) return false;
    std::vector<ServeEvent> events;
    g->channel->wait(events, std::chrono::milliseconds(100));
    g->end_open_choices(events);
    const std::string frames = g->apply(events);
    if (!frames.empty() && !sink.write(frames.data(), frames.size())) return false;
    if (g->done < g->choices.size()) return true;
    const std::string tail = g->req.stream ? g->stream_end() : g->body();
    if (!sink.write(tail.data(), tail.size())) return false;
    g->complete = true;
    sink.done();
    return true;
  };
  auto releaser = [g](bool) {
    if (g->done < g->choices.size()) {
      g->channel->abandon();
      g->queue->notify();
    }
    std::string outcome = "cancelled";  // the client left, or the server stopped
    if (g->complete && !g->failed) outcome = "finished";
    for (const Generation::Choice& c : g->choices) {
      if (c.finish == "error") outcome = "failed";
    }
    g->metrics->request_done(outcome);
    --*g->open;
  };
  if (g->req.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", provider, releaser);
  } else {
    res.set_chunked_content_provider("application/json", provider, releaser);
  }
}

// POST /v1/completions (chat false), /v1/chat/completions (chat true).
void post_generation(ApiServerState& st, bool chat, const httplib::Request& hreq, httplib::Response& res,
                     const httplib::ContentReader& reader) {
  const auto model = st.served();
  auto reject = [&](const ApiError& e) {
    st.metrics.request_done("rejected");
    send_error(res, e);
  };
  std::string body;
  if (const std::optional<ApiError> e = read_body(st.config.max_body_bytes, hreq, res, reader, body)) return reject(*e);
  if (!model) return reject(ApiError(503, "the model is still loading"));
  if (const std::string f = st.health ? st.health->failure() : std::string(); !f.empty()) {
    return reject(ApiError(503, "the server is failing: " + f));
  }
  if (st.stopping()) return reject(ApiError(503, "the server is shutting down"));
  auto g = std::make_shared<Generation>();
  try {
    g->req = parse_api_request(body, chat, model->api, model->limits);
  } catch (const ApiError& e) {
    return reject(e);
  }
  g->model = model;
  g->metrics = &st.metrics;
  g->queue = &st.queue;
  g->open = &st.open_responses;
  g->health = st.health;
  g->id = random_id(chat ? "chatcmpl-" : "cmpl-");
  g->created = static_cast<int64_t>(std::time(nullptr));
  g->channel = std::make_shared<ServeChannel>();
  if (const std::optional<ApiError> e = submit(st, *g, make_choices(*g, *model))) return reject(*e);
  ++st.open_responses;
  respond_as_tokens_come(std::move(g), res);
}

// The connection layer's settings (server/http/http_front.h) from the HTTP flags;
// --max-open-connections is cut to what the open-files limit allows, with a warning.
FrontConfig front_config(ApiServerState& st) {
  const int64_t open = fit_open_files(st.config.max_open_connections);
  if (open < st.config.max_open_connections) {
    std::fprintf(stderr,
                 "[linnet-tp] serve: warning: --max-open-connections %lld does not fit the open-files limit "
                 "(ulimit -n); using %lld\n",
                 static_cast<long long>(st.config.max_open_connections), static_cast<long long>(open));
  }
  FrontConfig fc;
  fc.max_open = open;
  fc.header_timeout_s = static_cast<double>(st.config.header_timeout_s);
  fc.body_timeout_s = static_cast<double>(st.config.timeout_s);
  fc.keep_alive_timeout_s = static_cast<double>(st.config.keep_alive_timeout_s);
  fc.keep_alive_max = 1000;
  fc.write_timeout_s = static_cast<double>(st.config.timeout_s);
  fc.api_threads = std::max<int64_t>(1, st.config.threads);
  fc.light_threads = 4;
  fc.framing.max_body_bytes = st.config.max_body_bytes;
  fc.error_body = [](int status, const std::string& message) { return dump_json(ApiError(status, message).body()); };
  fc.on_refused = [&st](const char* reason) { st.metrics.http_refused(reason); };
  return fc;
}

}  // namespace

ApiServer::ApiServer(HttpConfig config, RequestQueue& queue, ServeMetrics& metrics, const ServeHealth* health)
    : state_(new ApiServerState{std::move(config), queue, metrics, draining_, health, {}, {}, {}}) {
  ApiServerState& st = *state_;
  server_ = std::make_unique<FrontedServer>(front_config(st));
  st.open_connections = [this] { return server_->open_connections(); };
  FrontedServer& svr = *server_;
  svr.set_payload_max_length(static_cast<size_t>(st.config.max_body_bytes));
  svr.set_tcp_nodelay(true);
  // The listening socket, to widen httplib's accept backlog of 5 (a burst of clients
  // would otherwise overflow it) once it listens.
  svr.set_socket_options([this](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd_ = sock;
  });
  using httplib::Request;
  using httplib::Response;
  using httplib::ContentReader;
  svr.set_pre_routing_handler([&st](const Request& req, Response& res) { return check_api_key(st, req, res); });
  svr.set_error_handler(httplib::Server::HandlerWithResponse(
      [&st](const Request& req, Response& res) { return answer_http_error(st, req, res); }));
  svr.set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) { answer_exception(res, ep); });
  svr.Get("/health", [&st](const Request&, Response& res) { get_health(st, res); });
  svr.Get("/metrics", [&st](const Request&, Response& res) { get_metrics(st, res); });
  svr.Get("/v1/models", [&st](const Request&, Response& res) { get_models(st, res); });
  svr.Post("/tokenize", [&st](const Request& req, Response& res, const ContentReader& reader) {
    post_tokenizer_tool(st, tokenize_response, req, res, reader);
  });
  svr.Post("/detokenize", [&st](const Request& req, Response& res, const ContentReader& reader) {
    post_tokenizer_tool(st, detokenize_response, req, res, reader);
  });
  svr.Post("/v1/completions", [&st](const Request& req, Response& res, const ContentReader& reader) {
    post_generation(st, false, req, res, reader);
  });
  svr.Post("/v1/chat/completions", [&st](const Request& req, Response& res, const ContentReader& reader) {
    post_generation(st, true, req, res, reader);
  });
}

ApiServer::~ApiServer() { stop(); }

int ApiServer::bind() {
  const HttpConfig& c = state_->config;
  int port = c.port;
  if (c.port == 0) {
    port = server_->bind_to_any_port(c.host);
    if (port <= 0) throw Error("cannot listen (is the address valid?)", c.host + ":0");
  } else if (!server_->bind_to_port(c.host, c.port)) {
    throw Error("cannot listen (address in use or not valid?)", c.host + ":" + std::to_string(c.port));
  }
  if (listen_fd_ >= 0) ::listen(listen_fd_, 4096);  // the kernel caps it at somaxconn
  return port;
}

void ApiServer::start() {
  // The server's threads leave SIGINT / SIGTERM to the main thread (they inherit this).
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  server_->start_front();
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void ApiServer::ready(ServedModel model) {
  auto m = std::make_shared<const ServedModel>(std::move(model));
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->model = std::move(m);
}

void ApiServer::stop(std::chrono::milliseconds timeout) {
  if (!server_) return;
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (state_->open_responses > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (thread_.joinable()) {
    // stop() is a no-op until the thread listens.
    for (int i = 0; i < 2000 && !server_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_->stop_front(std::chrono::milliseconds(1000));
}

void ApiServer::drain() {
  draining_ = true;
  if (server_) server_->drain_front();
}

}  // namespace linnet
