// bench_tokenizer: encoding speed of linnet's tokenizer on one text file (not a test;
// scripts/bench_tokenizer.sh runs it beside the Hugging Face tokenizers package).
//
//   bench_tokenizer MODEL_DIR TEXT_FILE [RUNS=5] [IDS_OUT]
//
// Prints the load time, then the first (cold word cache) and the best of RUNS encodes
// of the whole file as one text (add_special_tokens = false, one thread), in ms and
// MB/s. With IDS_OUT, writes the ids, one per line, for comparison.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "loader/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR TEXT_FILE [RUNS=5] [IDS_OUT]\n", argv[0]);
    return 2;
  }
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  try {
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) throw std::runtime_error(std::string("cannot open ") + argv[2]);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const int runs = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;

    auto t0 = Clock::now();
    const linnet::Tokenizer tok = linnet::Tokenizer::from_dir(argv[1]);
    std::printf("load: %.1f ms\n", ms_since(t0));

    std::vector<int32_t> ids;
    double first = 0, best = 1e30;
    for (int r = 0; r < runs; ++r) {
      t0 = Clock::now();
      ids = tok.encode(text, false);
      const double ms = ms_since(t0);
      if (r == 0) first = ms;
      best = std::min(best, ms);
    }
    const double mb = static_cast<double>(text.size()) / 1e6;
    std::printf("linnet: %zu bytes -> %zu tokens; first %.1f ms (%.2f MB/s), best of %d %.1f ms (%.2f MB/s)\n",
                text.size(), ids.size(), first, mb / (first / 1e3), runs, best, mb / (best / 1e3));
    if (argc > 4) {
      std::ofstream out(argv[4]);
      for (const int32_t id : ids) out << id << '\n';
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
  return 0;
}
