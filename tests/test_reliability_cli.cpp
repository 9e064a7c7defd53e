// Crash safety of `linnet-tp generate --input` and `loss` end to end (issue 14): every
// finished request / pack is in the journal beside --output as soon as it is done; kill
// -9 of a rank, then --resume, gives a file byte-identical to an uninterrupted run; a
// torn last journal line is ignored; a lost output folder loses nothing; a stopped rank
// is named within --comm-timeout + 10 s; SIGINT to a rank or to scripts/mpirun.sh stops
// a loss run with exit 130 and the finished documents kept.
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli_harness.h"
#include "tests/test_data.h"

namespace linnet {
namespace {

using test::CliTest;
using test::quote;
using test::Result;
using test::slurp;
namespace fs = std::filesystem;
using nlohmann::json;

std::vector<std::string> lines_of(const fs::path& p) {
  std::vector<std::string> out;
  std::ifstream in(p);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// `n` story openings of 1 to 9 words in a varied order.
void write_prompts(const fs::path& in, int n) {
  const std::vector<std::string> words = {"Once", "upon", "a", "time,", "there", "was", "a", "little", "dog"};
  const std::vector<std::string> starts = {"", "Lily and Ben ", "The sun was hot. ", "Tom had a red ball. "};
  std::ofstream f(in);
  for (int i = 0; i < n; ++i) {
    std::string p = starts[static_cast<size_t>(i % 4)];
    for (int w = 0; w < 1 + (i * 5) % 9; ++w) p += (w ? " " : "") + words[static_cast<size_t>(w)];
    f << json{{"prompt", p}}.dump() << "\n";
  }
}

// 120 documents of 3 to 150 token ids (a fixed LCG), so that --max-seq-len 64 cuts some
// of them over several packs and packs hold several documents.
void write_documents(const fs::path& in) {
  std::ofstream f(in);
  uint32_t x = 12345;
  auto next = [&] { return x = x * 1664525u + 1013904223u; };
  for (int d = 0; d < 120; ++d) {
    const int len = 3 + static_cast<int>(next() >> 8) % 148;
    std::vector<int> ids;
    for (int i = 0; i < len; ++i) ids.push_back(1 + static_cast<int>((next() >> 8) % 511));
    f << json{{"ids", ids}}.dump() << "\n";
  }
}

// Seconds since the epoch, as `date +%s.%N` writes them.
double now_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class Reliability : public CliTest {
 protected:
  std::string stories() const { return quote(test::stories_dir().string()); }

  // Like signal_when_lines, and the moment the signal is sent goes to `mark` (epoch seconds).
  static std::string stop_when_lines(int rank, const fs::path& file, int lines, const fs::path& mark) {
    return "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = " + std::to_string(rank) +
           " ]; then \"$0\" \"$@\" & p=$!; i=0; while [ \"$(cat " + file.string() +
           " 2>/dev/null | wc -l)\" -lt " + std::to_string(lines) +
           " ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; date +%s.%N > " + mark.string() +
           "; kill -STOP $p; wait $p; exit $?; else exec \"$0\" \"$@\"; fi'";
  }
};

TEST_F(Reliability, GenerateResumeAfterKill9OfARankIsByteIdentical) {
  const fs::path in = tmp_ / "prompts.jsonl", full = tmp_ / "full.jsonl", out = tmp_ / "out.jsonl";
  const fs::path journal = tmp_ / "out.jsonl.journal";
  write_prompts(in, 40);
  const std::string args = "--model " + stories() + " --input " + quote(in.string()) +
                           " --max-new-tokens 100 --temperature 0.8 --max-batch 4";
  const Result a = run(2, args + " --seed 11 --output " + quote(full.string()));
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_FALSE(fs::exists(tmp_ / "full.jsonl.journal")) << "the journal goes once --output is written";
  const std::vector<std::string> want = lines_of(full);
  ASSERT_EQ(want.size(), 40u);

  // Rank 1 is killed once 6 requests are in the journal.
  const Result k = run(2, args + " --seed 11 --output " + quote(out.string()), signal_when_lines(1, "9", journal, 7));
  EXPECT_NE(k.code, 0);
  EXPECT_NE(k.code, 124) << "timed out";
  EXPECT_FALSE(fs::exists(out));
  EXPECT_NE(k.err.find("journal: " + journal.string()), std::string::npos) << k.err;
  const std::vector<std::string> got = lines_of(journal);
  ASSERT_GE(got.size(), 7u) << k.err;
  EXPECT_LT(got.size(), 41u) << "the kill came after the last request";
  const json header = json::parse(got[0]);
  EXPECT_EQ(header["linnet-tp journal"], "generate");
  EXPECT_EQ(header["seed"], 11);
  std::vector<bool> journaled(want.size(), false);
  for (size_t i = 1; i < got.size(); ++i) {
    const size_t index = json::parse(got[i])["index"].get<size_t>();
    ASSERT_LT(index, want.size());
    EXPECT_EQ(got[i], want[index]) << "journal line " << i + 1 << " is not the final line of its request";
    journaled[index] = true;
  }

  // A run without --resume would lose them: refused, naming the journal.
  const Result fresh = run(1, args + " --output " + quote(out.string()));
  EXPECT_EQ(fresh.code, 1);
  EXPECT_NE(fresh.err.find(journal.string() + ": an unfinished run left its journal here: give --resume"),
            std::string::npos)
      << fresh.err;

  // kill -9 in the middle of a write leaves a torn last line: it is ignored.
  size_t missing = 0;
  while (journaled[missing]) ++missing;
  {
    std::ofstream f(journal, std::ios::app | std::ios::binary);
    if (slurp(journal).back() != '\n') f << "\n";  // the kill may have cut one already
    f << want[missing].substr(0, 40);
  }
  // No --seed: the journal's seed, so the rest samples as the killed run would have.
  const Result r = run(2, args + " --output " + quote(out.string()) + " --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("ignoring " + journal.string() + ":"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("a last line without its newline (40 bytes"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(out), slurp(full));
  EXPECT_EQ(r.out, a.out);
  EXPECT_FALSE(fs::exists(journal));
}

// Issue 27: a sampled run with speculative decoding (the model as its own draft), killed
// (-9) and resumed with the same --speculative-config, writes what an uninterrupted run
// with prompt lookup writes; a resume without it is refused (the run settings keep the
// configuration: on CUDA a guess row may round differently, so the output there is not
// guaranteed to be the same).
TEST_F(Reliability, SpeculativeResumeAfterKill9IsByteIdentical) {
  const fs::path in = tmp_ / "prompts.jsonl", full = tmp_ / "full.jsonl", out = tmp_ / "out.jsonl";
  const fs::path journal = tmp_ / "out.jsonl.journal";
  write_prompts(in, 16);
  const std::string ngram = " --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'";
  const std::string spec = " --speculative-config '{\"method\": \"draft_model\", \"model\": \"" +
                           test::stories_dir().string() + "\", \"num_speculative_tokens\": 3}'";
  const std::string args = "--model " + stories() + " --input " + quote(in.string()) +
                           " --max-new-tokens 80 --temperature 0.8 --max-batch 4 --seed 5";
  const Result a = run(2, args + ngram + " --output " + quote(full.string()));
  ASSERT_EQ(a.code, 0) << a.err;
  const Result k = run(2, args + spec + " --output " + quote(out.string()), signal_when_lines(1, "9", journal, 5));
  EXPECT_NE(k.code, 0);
  ASSERT_GE(lines_of(journal).size(), 5u) << k.err;
  const Result other = run(2, args + " --output " + quote(out.string()) + " --resume");
  EXPECT_NE(other.code, 0);
  EXPECT_NE(other.err.find("speculative_config"), std::string::npos) << other.err;
  const Result r = run(2, args + spec + " --output " + quote(out.string()) + " --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(out), slurp(full));
}

TEST_F(Reliability, LossResumeAfterKill9OfRank0IsByteIdentical) {
  const fs::path in = tmp_ / "docs.jsonl", full = tmp_ / "full.jsonl", out = tmp_ / "out.jsonl";
  const fs::path journal = tmp_ / "out.jsonl.journal";
  write_documents(in);
  const std::string args = "loss --model " + stories() + " --input " + quote(in.string()) + " --max-seq-len 64";
  const Result a = run(2, args + " --output " + quote(full.string()));
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(lines_of(full).size(), 120u);
  EXPECT_FALSE(fs::exists(tmp_ / "full.jsonl.journal"));

  // Rank 0, which writes the journal, is killed once 10 packs are in it.
  const Result k = run(2, args + " --output " + quote(out.string()), signal_when_lines(0, "9", journal, 11));
  EXPECT_NE(k.code, 0);
  EXPECT_NE(k.code, 124) << "timed out";
  EXPECT_FALSE(fs::exists(out));
  const std::vector<std::string> got = lines_of(journal);
  ASSERT_GE(got.size(), 11u) << k.err;
  const json header = json::parse(got[0]);
  EXPECT_EQ(header["linnet-tp journal"], "loss");
  EXPECT_EQ(header["documents"], 120);
  EXPECT_EQ(header["max_seq_len"], 64);
  EXPECT_LT(got.size(), header["packs"].get<size_t>() + 1) << "the kill came after the last pack";
  for (size_t i = 1; i + 1 < got.size(); ++i) {  // the last one may be torn
    const json rec = json::parse(got[i]);
    EXPECT_TRUE(rec["pack"].is_number_unsigned()) << got[i];
    EXPECT_FALSE(rec["docs"].empty()) << got[i];
  }

  const Result r = run(2, args + " --output " + quote(out.string()) + " --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(out), slurp(full));
  // The same sums, so the same summary (tokens/s aside).
  EXPECT_EQ(r.out.substr(0, r.out.find("tokens/s")), a.out.substr(0, a.out.find("tokens/s")));
  EXPECT_FALSE(fs::exists(journal));
}

// SIGINT to one rank: every rank stops after the pack in flight, the documents done are
// in --output and the journal, the run exits 130, and --resume finishes it.
TEST_F(Reliability, SigintToALossRankKeepsFinishedDocumentsAndExits130) {
  const fs::path in = tmp_ / "docs.jsonl", full = tmp_ / "full.jsonl", out = tmp_ / "out.jsonl";
  const fs::path journal = tmp_ / "out.jsonl.journal";
  write_documents(in);
  const std::string args = "loss --model " + stories() + " --input " + quote(in.string()) + " --max-seq-len 64";
  ASSERT_EQ(run(2, args + " --output " + quote(full.string())).code, 0);
  const std::vector<std::string> want = lines_of(full);

  const Result k = run(2, args + " --output " + quote(out.string()), signal_when_lines(1, "INT", journal, 6));
  EXPECT_EQ(k.code, 130) << k.err;
  const size_t at = k.err.find("interrupted: ");
  ASSERT_NE(at, std::string::npos) << k.err;
  const size_t done = std::stoul(k.err.substr(at + 13));
  EXPECT_NE(k.err.find(" of 120 documents done (kept in --output and in the journal " + journal.string() +
                       "); rerun with --resume"),
            std::string::npos)
      << k.err;
  EXPECT_EQ(k.out, "") << "no summary of a part of the documents";
  const std::vector<std::string> kept = lines_of(out);
  EXPECT_EQ(kept.size(), done);
  EXPECT_GT(done, 0u);
  EXPECT_LT(done, 120u);
  for (const auto& line : kept) EXPECT_EQ(line, want[json::parse(line)["index"].get<size_t>()]);
  EXPECT_TRUE(fs::exists(journal));

  const Result r = run(2, args + " --output " + quote(out.string()) + " --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(out), slurp(full));
  EXPECT_FALSE(fs::exists(journal));
}

// The journal's header keeps the run's settings: a resume with other flags would mix the
// lines of two runs in one file, so it is refused naming the setting.
TEST_F(Reliability, AResumeWithOtherSettingsIsRefused) {
  const fs::path prompts = tmp_ / "prompts.jsonl", docs = tmp_ / "docs.jsonl", out = tmp_ / "out.jsonl";
  const fs::path journal = tmp_ / "out.jsonl.journal";
  write_prompts(prompts, 40);
  write_documents(docs);
  const std::string gen = "--model " + stories() + " --input " + quote(prompts.string()) +
                          " --max-new-tokens 100 --temperature 0.8 --seed 3 --max-batch 4 --output " + quote(out.string());
  const Result k = run(2, gen, signal_when_lines(0, "9", journal, 4));
  ASSERT_NE(k.code, 0);
  ASSERT_TRUE(fs::exists(journal));
  const Result other = run(2, gen + " --max-new-tokens 5 --resume");
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.err.find(journal.string() + ":1: --output was written by a run with other settings: "
                                               "max_new_tokens is 5 in this run and was 100 in that one"),
            std::string::npos)
      << other.err;
  const Result same = run(2, gen + " --resume");
  EXPECT_EQ(same.code, 0) << same.err;
  // Finished: the journal is gone, the run record beside --output keeps the settings, so
  // a resume over the finished file is still checked (it accepted any model and flags).
  const fs::path record = tmp_ / "out.jsonl.run.json";
  ASSERT_FALSE(fs::exists(journal));
  ASSERT_TRUE(fs::exists(record));
  const std::string finished = slurp(out);
  const Result after = run(2, gen + " --max-new-tokens 5 --resume");
  EXPECT_EQ(after.code, 1);
  EXPECT_NE(after.err.find(record.string() + ":1: --output was written by a run with other settings: "
                                             "max_new_tokens is 5 in this run and was 100 in that one"),
            std::string::npos)
      << after.err;
  const Result again = run(2, gen + " --resume");  // the same run again: nothing to do, the same file
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(slurp(out), finished);
  fs::remove(record);
  const Result blind = run(2, gen + " --resume");
  EXPECT_EQ(blind.code, 1);
  EXPECT_NE(blind.err.find("holds lines but neither its journal nor its run record"), std::string::npos) << blind.err;

  const std::string loss = "loss --model " + stories() + " --input " + quote(docs.string()) +
                           " --max-seq-len 64 --output " + quote(out.string());
  fs::remove(out);
  const Result kl = run(2, loss, signal_when_lines(0, "9", journal, 4));
  ASSERT_NE(kl.code, 0);
  ASSERT_TRUE(fs::exists(journal));
  const Result bf16 = run(2, loss + " --weight-dtype bf16 --resume");
  EXPECT_EQ(bf16.code, 1);
  EXPECT_NE(bf16.err.find(journal.string() + ":1: --output was written by a run with other settings: weight_dtype "
                                              "is \"bf16\" in this run and was \"auto\" in that one"),
            std::string::npos)
      << bf16.err;
  const Result finish = run(2, loss + " --resume");
  EXPECT_EQ(finish.code, 0) << finish.err;
  const Result bf16_after = run(2, loss + " --weight-dtype bf16 --resume");
  EXPECT_EQ(bf16_after.code, 1);
  EXPECT_NE(bf16_after.err.find("out.jsonl.run.json:1: --output was written by a run with other settings: weight_dtype"),
            std::string::npos)
      << bf16_after.err;
  // A kept loss line whose mean is not its sum's (edited) is refused, not copied on.
  std::vector<std::string> out_lines = lines_of(out);
  json first = json::parse(out_lines.at(0));
  first["mean_nll"] = first["mean_nll"].get<double>() + 0.5;
  out_lines[0] = first.dump();
  {
    std::ofstream f(out, std::ios::binary | std::ios::trunc);
    for (const std::string& l : out_lines) f << l << "\n";
  }
  const Result edited = run(2, loss + " --resume");
  EXPECT_EQ(edited.code, 1);
  EXPECT_NE(edited.err.find("are not those linnet-tp writes"), std::string::npos) << edited.err;

  // Quantized runs record their group size (the default when none is given): another
  // one gives other weights, so it is refused as another dtype is.
  fs::remove(out);
  // (stories260k at tp 2: down_proj slices of 86, so groups of 1 or 2.)
  const Result q2 = run(2, loss + " --weight-dtype int8 --weight-group-size 2");
  ASSERT_EQ(q2.code, 0) << q2.err;
  const Result q1 = run(2, loss + " --weight-dtype int8 --weight-group-size 1 --resume");
  EXPECT_EQ(q1.code, 1);
  EXPECT_NE(q1.err.find("weight_group_size is 1 in this run and was 2 in that one"), std::string::npos) << q1.err;
  const Result same_group = run(2, loss + " --weight-dtype int8 --weight-group-size 2 --resume");
  EXPECT_EQ(same_group.code, 0) << same_group.err;
}

// A kept line is checked against the input and against what linnet-tp writes; a refusal
// names the file and line (journal or --output) and the index.
TEST_F(Reliability, AnEditedKeptLineIsRefusedNamingItsFileAndLine) {
  const fs::path prompts = tmp_ / "prompts.jsonl", out = tmp_ / "out.jsonl";
  const fs::path journal = tmp_ / "out.jsonl.journal";
  write_prompts(prompts, 40);
  const std::string gen = "--model " + stories() + " --input " + quote(prompts.string()) +
                          " --max-new-tokens 100 --max-batch 4 --output " + quote(out.string());
  const Result k = run(2, gen, signal_when_lines(0, "9", journal, 4));
  ASSERT_NE(k.code, 0);
  std::vector<std::string> lines = lines_of(journal);
  ASSERT_GE(lines.size(), 4u);
  json edited = json::parse(lines[2]);
  const int64_t index = edited["index"].get<int64_t>();
  edited["evil"] = 1;
  lines[2] = edited.dump();
  {
    std::ofstream f(journal, std::ios::binary | std::ios::trunc);
    for (size_t i = 0; i < 4; ++i) f << lines[i] << "\n";
  }
  const Result r = run(2, gen + " --resume");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(journal.string() + ":3 (index " + std::to_string(index) +
                       "): a kept line has a key linnet-tp does not write: \"evil\""),
            std::string::npos)
      << r.err;
  edited.erase("evil");
  edited["prompt"] = "another prompt";
  lines[2] = edited.dump();
  {
    std::ofstream f(journal, std::ios::binary | std::ios::trunc);
    for (size_t i = 0; i < 4; ++i) f << lines[i] << "\n";
  }
  const Result p = run(2, gen + " --resume");
  EXPECT_EQ(p.code, 1);
  EXPECT_NE(p.err.find(journal.string() + ":3 (index " + std::to_string(index) + "): its prompt differs from "),
            std::string::npos)
      << p.err;

  // Its values are checked as an input line's: an id outside the vocabulary, a text that
  // is not its ids' (both were copied into --output).
  auto write_with = [&](const json& third, const char* eol) {
    std::ofstream f(journal, std::ios::binary | std::ios::trunc);
    for (size_t i = 0; i < 4; ++i) f << (i == 2 ? third.dump() : lines[i]) << eol;
  };
  json good = edited;
  good["prompt"] = json::parse(lines_of(prompts)[static_cast<size_t>(index)])["prompt"];
  json bad_id = good;
  bad_id["completion_ids"][0] = 512;  // stories260k's vocabulary is 0..511
  write_with(bad_id, "\n");
  const Result v = run(2, gen + " --resume");
  EXPECT_EQ(v.code, 1);
  EXPECT_NE(v.err.find(journal.string() + ":3 (index " + std::to_string(index) +
                       "): its \"completion_ids\" holds 512, not a token id of this model (0 to 511)"),
            std::string::npos)
      << v.err;
  json bad_finish = good;  // a finish reason its ids do not bear out
  bad_finish["finish_reason"] = good["finish_reason"] == "length" ? "stop" : "length";
  write_with(bad_finish, "\n");
  const Result f = run(2, gen + " --resume");
  EXPECT_EQ(f.code, 1);
  EXPECT_NE(f.err.find("its finish_reason \"" + bad_finish["finish_reason"].get<std::string>() + "\" does not fit its"),
            std::string::npos)
      << f.err;
  json bad_text = good;
  bad_text["completion"] = "Something else entirely.";
  write_with(bad_text, "\n");
  const Result t = run(2, gen + " --resume");
  EXPECT_EQ(t.code, 1);
  EXPECT_NE(t.err.find("its \"completion\" is not the text of its \"completion_ids\""), std::string::npos) << t.err;
  // A journal with CR LF line ends (16 lines of --output kept a trailing CR): resumed, and
  // --output holds no CR.
  for (std::string& l : lines) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
  }
  write_with(good, "\r\n");
  const Result crlf = run(2, gen + " --resume");
  EXPECT_EQ(crlf.code, 0) << crlf.err;
  EXPECT_EQ(slurp(out).find('\r'), std::string::npos);
  EXPECT_EQ(lines_of(out).size(), 40u);
}

// A signal during start-up (MPI start, groups, loading) is kept, not fatal: the run stops
// at its first step with exit 130 and says so. The signal is sent the moment the rank's
// handler is in place (SigCgt of /proc/PID/status shows SIGUSR1): main() installs it
// before MPI_Init, so it lands in MPI's start-up (a signal before main() still kills).
TEST_F(Reliability, ASignalAsSoonAsTheHandlersExistStopsTheRunGracefully) {
  const fs::path in = tmp_ / "docs.jsonl", out = tmp_ / "out.jsonl";
  write_documents(in);
  const std::string wrap =
      R"(sh -c 'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then "$0" "$@" & p=$!; i=0; )"
      R"(while [ $i -lt 5000 ]; do m=$(sed -n "s/^SigCgt:[[:space:]]*//p" /proc/$p/status 2>/dev/null); )"
      R"([ -n "$m" ] && [ $((0x$m & 512)) -ne 0 ] && break; i=$((i+1)); done; )"
      R"(kill -USR1 $p; wait $p; exit $?; else exec "$0" "$@"; fi')";
  const fs::path prompts = tmp_ / "prompts.jsonl";
  write_prompts(prompts, 40);
  for (const std::string command : {"loss", "generate"}) {
    const std::string args = command == "loss" ? "loss --model " + stories() + " --input " + quote(in.string())
                                               : "--model " + stories() + " --input " + quote(prompts.string());
    fs::remove(out);
    fs::remove(tmp_ / "out.jsonl.journal");
    const Result k = run(2, args + " --output " + quote(out.string()), wrap);
    EXPECT_EQ(k.code, 130) << command << ": " << k.err;
    EXPECT_NE(k.err.find("interrupted: "), std::string::npos) << command << ": " << k.err;
    EXPECT_EQ(k.err.find("exited on signal"), std::string::npos) << command << ": " << k.err;
  }
}

// An --input that never ends: a device is refused at once (`--input /dev/zero` spun at
// 100% CPU, deaf to SIGTERM, until SIGKILL), and SIGTERM stops a run reading a FIFO whose
// writer stalls mid-line within a second, exit 130 (it waited for the writer to close).
TEST_F(Reliability, AnEndlessOrStalledInputIsRefusedOrStoppedBySignals) {
  for (const std::string command : {"generate", "loss"}) {
    const std::string sub = command == "loss" ? "loss " : "";
    const Result r = run(1, sub + "--model " + stories() + " --input /dev/zero");
    EXPECT_EQ(r.code, 1) << command << ": " << r.err;
    EXPECT_NE(r.err.find("/dev/zero: is a character device, not a JSONL file"), std::string::npos) << r.err;
    EXPECT_LT(r.seconds, 30) << command;
  }
  const fs::path fifo = tmp_ / "in.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string command : {"generate", "loss"}) {
    const std::string sub = command == "loss" ? "loss " : "";
    // The writer: half a line, then silence with the FIFO held open.
    const std::string writer_cmd = "exec 3>" + quote(fifo.string()) +
                                   "; printf '{\"prompt\": \"Once upon' >&3; exec sleep 60";
    const pid_t writer = ::fork();
    if (writer == 0) {
      ::execl("/bin/sh", "sh", "-c", writer_cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    const pid_t pid = spawn(quote(bin_.string()) + " " + sub + "--model " + stories() + " --input " + quote(fifo.string()));
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // reading by now
    const auto t0 = std::chrono::steady_clock::now();
    ::kill(pid, SIGTERM);
    const Result r = wait_spawned(pid, 20);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ::kill(writer, SIGKILL);
    ::waitpid(writer, nullptr, 0);
    EXPECT_EQ(r.code, 130) << command << ": " << r.err;
    EXPECT_NE(r.err.find("interrupted: a stop signal came while the input " + fifo.string() + " was read"),
              std::string::npos)
        << command << ": " << r.err;
    EXPECT_LT(took, 3.0) << command << ": SIGTERM took " << took << " s";
  }
}

// Open MPI's mpirun never passes SIGINT on (it exits 1); scripts/mpirun.sh turns it into
// SIGUSR1, which mpirun forwards, so the run stops gracefully and exits 130.
TEST_F(Reliability, SigintToScriptsMpirunStopsALossRunWithExit130) {
  const fs::path in = tmp_ / "docs.jsonl", out = tmp_ / "out.jsonl", journal = tmp_ / "out.jsonl.journal";
  write_documents(in);
  const fs::path script = test::test_data_dir() / ".." / ".." / "scripts" / "mpirun.sh";
  ASSERT_TRUE(fs::exists(script)) << script;
  const pid_t pid = spawn(quote(script.string()) + " -np 2 " + quote(bin_.string()) + " loss --model " + stories() +
                          " --input " + quote(in.string()) + " --max-seq-len 64 --output " + quote(out.string()));
  ASSERT_TRUE(wait_for_lines(journal, 6, 60)) << slurp(tmp_ / "stderr");
  ::kill(pid, SIGINT);
  const Result r = wait_spawned(pid, 60);
  EXPECT_EQ(r.code, 130) << r.err;
  EXPECT_NE(r.err.find("interrupted: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" of 120 documents done (kept in --output"), std::string::npos) << r.err;
  EXPECT_GT(lines_of(out).size(), 0u);
  EXPECT_TRUE(fs::exists(journal));
}

// A rank stopped mid-run (SIGSTOP) while its tp group waits in a collective: every rank
// exits non-zero within --comm-timeout + 10 s, the message naming the stopped rank.
TEST_F(Reliability, AStoppedRankIsNamedWithinTheCommTimeout) {
  const fs::path in = tmp_ / "prompts.jsonl", out = tmp_ / "out.jsonl", journal = tmp_ / "out.jsonl.journal";
  const fs::path mark = tmp_ / "stopped_at";
  write_prompts(in, 64);
  const Result r = run(2,
                       "--model " + stories() + " --input " + quote(in.string()) +
                           " --max-new-tokens 200 --max-batch 4 --comm-timeout 5 --output " + quote(out.string()),
                       stop_when_lines(1, journal, 3, mark));
  const double since_stop = now_epoch() - std::stod(slurp(mark));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out: " << r.err;
  EXPECT_LT(since_stop, 15.0) << r.err;
  EXPECT_NE(r.err.find("made no progress for 5 s (--comm-timeout 5"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stopped (SIGSTOP or a debugger)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the finished work is kept in the journal " + journal.string()), std::string::npos) << r.err;
  EXPECT_GE(lines_of(journal).size(), 3u);
}

// The stopped rank is in another dp group: it shares no collective with rank 0, which
// has finished its share and waits at the end of the run for its heartbeats.
TEST_F(Reliability, AStoppedRankOfAnotherDpGroupIsNamedAtTheFinishLine) {
  const fs::path in = tmp_ / "prompts.jsonl", out = tmp_ / "out.jsonl", journal = tmp_ / "out.jsonl.journal";
  const fs::path mark = tmp_ / "stopped_at";
  {
    // Group 0 (even lines) gets one token each, group 1 (odd lines) up to 150.
    std::ofstream f(in);
    for (int i = 0; i < 240; ++i) f << json{{"prompt", "Once upon a time"}, {"max_new_tokens", i % 2 ? 150 : 1}}.dump() << "\n";
  }
  // Stopped once group 0's 120 lines and 3 of group 1 are in the journal.
  const Result r = run(2,
                       "--model " + stories() + " --input " + quote(in.string()) +
                           " --tp 1 --comm-timeout 5 --output " + quote(out.string()),
                       stop_when_lines(1, journal, 124, mark));
  const double since_stop = now_epoch() - std::stod(slurp(mark));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out: " << r.err;
  EXPECT_LT(since_stop, 15.0) << r.err;
  EXPECT_NE(r.err.find("waiting at the end of the run for the ranks still working: no sign of progress for 5 s "
                       "(--comm-timeout 5) from rank 1 (pid "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("stopped (SIGSTOP or a debugger)"), std::string::npos) << r.err;
  EXPECT_GE(lines_of(journal).size(), 124u);
}

// The output's folder is removed mid-run: the journal goes on in TMPDIR, the final error
// says where and how to resume, and resuming from it gives the uninterrupted run's file.
TEST_F(Reliability, ALostOutputFolderLosesNoFinishedRequest) {
  const fs::path in = tmp_ / "prompts.jsonl", full = tmp_ / "full.jsonl", sub = tmp_ / "sub";
  const fs::path out = sub / "out.jsonl", journal = sub / "out.jsonl.journal", rescue = tmp_ / "rescue";
  write_prompts(in, 32);
  fs::create_directories(sub);
  fs::create_directories(rescue);
  const std::string args = "--model " + stories() + " --input " + quote(in.string()) +
                           " --max-new-tokens 120 --max-batch 4 --output ";
  ASSERT_EQ(run(2, args + quote(full.string())).code, 0);
  const std::string remove_folder =
      "env TMPDIR=" + rescue.string() + " sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then \"$0\" \"$@\" & p=$!; i=0; "
      "while [ \"$(cat " + journal.string() + " 2>/dev/null | wc -l)\" -lt 5 ] && [ $i -lt 1200 ]; do sleep 0.05; "
      "i=$((i+1)); done; rm -rf " + sub.string() + "; wait $p; exit $?; else exec \"$0\" \"$@\"; fi'";
  const Result r = run(2, args + quote(out.string()), remove_folder);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("--output " + out.string()), std::string::npos) << r.err;
  std::vector<fs::path> moved;
  for (const auto& e : fs::directory_iterator(rescue)) moved.push_back(e.path());
  ASSERT_EQ(moved.size(), 1u) << r.err;
  EXPECT_NE(r.err.find("the finished work is kept in the journal " + moved[0].string() +
                       " (moved there: its folder vanished (removed or renamed?)): put it back as " + journal.string() +
                       " and rerun with --resume"),
            std::string::npos)
      << r.err;
  // Everything finished is there: all 32 requests (the run ended before it failed).
  EXPECT_EQ(lines_of(moved[0]).size(), 33u);

  fs::create_directories(sub);
  fs::rename(moved[0], journal);
  const Result again = run(2, args + quote(out.string()) + " --resume");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("requests: 0 (0 failed), 32 kept from --output and the journal"), std::string::npos)
      << again.err;
  EXPECT_EQ(slurp(out), slurp(full));
}

}  // namespace
}  // namespace linnet
