// Test harness for end-to-end tests of the linnet-tp executable: run it under mpirun
// with a timeout, capture stdout/stderr/exit code/time, copy and corrupt models, and
// check that a bad input fails cleanly (non-zero, within seconds, no --output left).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_data.h"

namespace linnet::test {

namespace fs = std::filesystem;

/// What a run of linnet-tp gave: exit code, stdout, stderr, wall time.
struct Result {
  int code = -1;
  std::string out, err;
  double seconds = 0;
};

/// `s` single-quoted for /bin/sh.
inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// The whole file (empty when absent).
inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Runs the linnet-tp executable (LINNET_BIN) directly, without mpirun (an MPI
/// singleton), with `args` already quoted: stdout captured, stderr written to `err_file`
/// and read back. `env`: VAR=value words put before the command (already quoted).
inline Result run_direct(const std::string& args, const fs::path& err_file, const std::string& env = "") {
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + quote(env_path("LINNET_BIN").string()) + " " +
                          args + " 2>" + quote(err_file.string());
  Result r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) r.out.append(buf, n);
  const int status = ::pclose(pipe);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = slurp(err_file);
  return r;
}

/// Runs the linnet-tp executable (LINNET_BIN) under mpirun (LINNET_MPIEXEC) in a fresh
/// temp dir per test; ctest sets both variables.
class CliTest : public testing::Test {
 protected:
  void SetUp() override {
    bin_ = test::env_path("LINNET_BIN");
    mpiexec_ = test::env_path("LINNET_MPIEXEC");
    if (bin_.empty() || mpiexec_.empty()) GTEST_SKIP() << "LINNET_BIN / LINNET_MPIEXEC not set (run via ctest)";
    tmp_ = fs::temp_directory_path() /
           ("linnet_cli_" + std::to_string(::getpid()) + "_" +
            testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    if (!tmp_.empty()) fs::remove_all(tmp_);
  }

  // Runs `args` under mpirun -np ranks with a 60 s timeout.
  Result run(int ranks, const std::string& args, const std::string& wrapper = "",
             const std::string& stdin_file = "/dev/null") {
    const fs::path out = tmp_ / "stdout", err = tmp_ / "stderr";
    std::string exe = quote(bin_.string());
    if (!wrapper.empty()) exe = wrapper + " " + exe;
    const std::string cmd = "timeout -k 5 60 " + quote(mpiexec_.string()) +
                            " --oversubscribe --bind-to none --allow-run-as-root -np " + std::to_string(ranks) + " " + exe +
                            " " + args + " >" + quote(out.string()) + " 2>" + quote(err.string()) + " <" + quote(stdin_file);
    const auto t0 = std::chrono::steady_clock::now();
    const int status = std::system(cmd.c_str());
    Result r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  // A wrapper for run(): world rank `rank` starts linnet-tp in the background and gets
  // `signal` (e.g. "9", "STOP", "INT") once `file` has at least `lines` lines (at most
  // after 60 s), then the wrapper waits for it.
  static std::string signal_when_lines(int rank, const std::string& signal, const fs::path& file, int lines) {
    return "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = " + std::to_string(rank) +
           " ]; then \"$0\" \"$@\" & p=$!; i=0; while [ \"$(cat " + file.string() +
           " 2>/dev/null | wc -l)\" -lt " + std::to_string(lines) +
           " ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; kill -" + signal +
           " $p; wait $p; exit $?; else exec \"$0\" \"$@\"; fi'";
  }

  // Lines of `file` now (0 when absent).
  static int count_lines(const fs::path& file) {
    const std::string text = slurp(file);
    return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  }

  // Starts `cmd` under /bin/sh -c with SIGINT and SIGQUIT at their default actions (a
  // shell's background job would ignore them, and a script could not trap them), its
  // stdout and stderr to tmp_/stdout and tmp_/stderr. Returns its pid.
  pid_t spawn(const std::string& cmd) {
    const std::string full = "exec " + cmd + " >" + quote((tmp_ / "stdout").string()) + " 2>" +
                             quote((tmp_ / "stderr").string()) + " </dev/null";
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGQUIT, SIG_DFL);
      ::execl("/bin/sh", "sh", "-c", full.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return pid;
  }

  // Waits up to `seconds` for a spawn()ed `pid` (then SIGKILLs it: code 124). Returns
  // its exit code, stdout and stderr.
  Result wait_spawned(pid_t pid, double seconds) {
    Result r;
    const auto t0 = std::chrono::steady_clock::now();
    int status = 0;
    for (;;) {
      const pid_t w = ::waitpid(pid, &status, WNOHANG);
      if (w == pid) {
        r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        r.code = 124;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.out = slurp(tmp_ / "stdout");
    r.err = slurp(tmp_ / "stderr");
    return r;
  }

  // Waits up to `seconds` until `file` has at least `lines` lines; false when it did not.
  static bool wait_for_lines(const fs::path& file, int lines, double seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    while (count_lines(file) < lines) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  fs::path copy_model() {
    const fs::path dst = tmp_ / "model";
    fs::copy(test::stories_dir(), dst);
    for (const auto& e : fs::directory_iterator(dst)) {
      fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    }
    return dst;
  }

  // Rewrites a safetensors header in place (data area untouched).
  static void edit_header(const fs::path& file, const std::function<void(nlohmann::json&)>& edit) {
    std::string bytes = slurp(file);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
    edit(h);
    const std::string header = h.dump();
    const uint64_t m = header.size();
    std::string out(reinterpret_cast<const char*>(&m), 8);
    out += header + bytes.substr(8 + n);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << out;
  }

  // A copy of stories260k (copy_model) whose embedding row `id` is NaN. stories260k ties
  // lm_head to the embedding, so the copy gets an untied lm_head.weight holding the clean
  // embedding (a third shard, in the index): only prompts or documents that hold `id`
  // meet a NaN, everything else computes exactly as before. Returns the model folder.
  fs::path model_with_nan_embedding_row(int64_t id) {
    const fs::path model = copy_model();
    const auto index = test::read_json(model / "model.safetensors.index.json");
    const fs::path file = model / index["weight_map"]["model.embed_tokens.weight"].get<std::string>();
    std::string bytes = slurp(file);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    const nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
    const auto& t = h.at("model.embed_tokens.weight");
    EXPECT_EQ(t["dtype"], "F32");
    const int64_t hidden = t["shape"][1];
    const size_t begin = 8 + n + t["data_offsets"][0].get<size_t>(), end = 8 + n + t["data_offsets"][1].get<size_t>();
    std::string header = nlohmann::json{{"lm_head.weight", {{"dtype", "F32"}, {"shape", t["shape"]},
                                                            {"data_offsets", {0, end - begin}}}}}.dump();
    header.resize((header.size() + 7) / 8 * 8, ' ');
    const uint64_t m = header.size();
    std::ofstream(model / "lm_head.safetensors", std::ios::binary)
        << std::string(reinterpret_cast<const char*>(&m), 8) << header << bytes.substr(begin, end - begin);
    auto idx = index;
    idx["weight_map"]["lm_head.weight"] = "lm_head.safetensors";
    std::ofstream(model / "model.safetensors.index.json") << idx.dump();
    auto config = test::read_json(model / "config.json");
    config["tie_word_embeddings"] = false;
    std::ofstream(model / "config.json") << config.dump();
    const float nan = std::nanf("");
    const size_t row = begin + static_cast<size_t>(id * hidden) * 4;
    for (int64_t k = 0; k < hidden; ++k) std::memcpy(bytes.data() + row + static_cast<size_t>(k) * 4, &nan, 4);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    return model;
  }

  // Expects a clean failure of a 2-rank job: non-zero exit, within seconds, the message
  // on stderr, and no --output file.
  void expect_clean_failure(const std::string& args, const std::string& message, int ranks = 2) {
    const fs::path output = tmp_ / "out.jsonl";
    const Result r = run(ranks, args + " --output " + quote(output.string()));
    EXPECT_NE(r.code, 0) << r.err;
    EXPECT_NE(r.code, 124) << "timed out: " << r.err;
    EXPECT_LT(r.seconds, 30.0);
    EXPECT_NE(r.err.find(message), std::string::npos) << "stderr was:\n" << r.err;
    EXPECT_FALSE(fs::exists(output));
    for (const auto& e : fs::directory_iterator(tmp_)) {
      EXPECT_EQ(e.path().filename().string().find("out.jsonl"), std::string::npos) << e.path();
    }
  }

  fs::path bin_, mpiexec_, tmp_;
};

}  // namespace linnet::test
