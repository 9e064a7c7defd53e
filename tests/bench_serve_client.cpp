// bench_serve_client: a load client for `linnet-tp serve` (not a test;
// scripts/bench_serve.sh runs it). C threads send the P prompts of a JSONL file (each
// line a /v1/completions body) as streaming requests, one at a time each, and time them.
//
//   bench_serve_client PORT PROMPTS.jsonl CONCURRENCY
//
// Prints one JSON line: requests, seconds, requests_per_s, output_tokens,
// output_tokens_per_s, ttft_ms_p50 / p99 (send to first text chunk), itl_ms_p50 / p99
// (between chunks of a request), failed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s PORT PROMPTS.jsonl CONCURRENCY\n", argv[0]);
    return 2;
  }
  using Clock = std::chrono::steady_clock;
  const int port = std::atoi(argv[1]);
  const int concurrency = std::max(1, std::atoi(argv[3]));
  std::vector<std::string> bodies;
  {
    std::ifstream in(argv[2]);
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line);
      j["stream"] = true;
      j["stream_options"] = {{"include_usage", true}};
      bodies.push_back(j.dump());
    }
  }
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::vector<double> ttft, itl;
  long long tokens = 0, failed = 0;
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(600, 0);
      for (size_t i; (i = next++) < bodies.size();) {
        const auto start = Clock::now();
        auto last = start;
        bool first = true;
        std::vector<double> my_itl;
        double my_ttft = 0;
        long long my_tokens = 0;
        std::string pending;
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/completions";
        req.body = bodies[i];
        req.set_header("Content-Type", "application/json");
        req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
          pending.append(data, n);
          for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
            const std::string frame = pending.substr(0, end);
            pending.erase(0, end + 2);
            if (frame.rfind("data: ", 0) != 0 || frame == "data: [DONE]") continue;
            const auto j = nlohmann::json::parse(frame.substr(6), nullptr, false);
            if (j.contains("usage") && j["usage"].is_object()) my_tokens = j["usage"]["completion_tokens"];
            if (!j.contains("choices") || j["choices"].empty()) continue;
            const auto now = Clock::now();
            if (first) {
              my_ttft = std::chrono::duration<double, std::milli>(now - start).count();
              first = false;
            } else {
              my_itl.push_back(std::chrono::duration<double, std::milli>(now - last).count());
            }
            last = now;
          }
          return true;
        };
        auto res = client.send(req);
        std::lock_guard<std::mutex> lock(mutex);
        if (!res || res->status != 200) {
          ++failed;
          continue;
        }
        ttft.push_back(my_ttft);
        itl.insert(itl.end(), my_itl.begin(), my_itl.end());
        tokens += my_tokens;
      }
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  nlohmann::ordered_json out;
  out["requests"] = bodies.size();
  out["concurrency"] = concurrency;
  out["seconds"] = seconds;
  out["requests_per_s"] = static_cast<double>(bodies.size() - static_cast<size_t>(failed)) / seconds;
  out["output_tokens"] = tokens;
  out["output_tokens_per_s"] = static_cast<double>(tokens) / seconds;
  out["ttft_ms_p50"] = percentile(ttft, 0.5);
  out["ttft_ms_p99"] = percentile(ttft, 0.99);
  out["itl_ms_p50"] = percentile(itl, 0.5);
  out["itl_ms_p99"] = percentile(itl, 0.99);
  out["failed"] = failed;
  std::printf("%s\n", out.dump().c_str());
  return failed ? 1 : 0;
}
