// The journal of generate --input / loss (driver/journal.h) without a model: read back
// with a torn or damaged last line, refused when damaged elsewhere or of another
// command, continued after its last whole line, and moved to the temp folder when its
// folder vanishes mid-run.
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "driver/journal.h"
#include "driver/jsonl_output.h"
#include "tests/test_helpers.h"

namespace linnet {
namespace {

using linnet::test::read_file;

namespace fs = std::filesystem;
using nlohmann::ordered_json;

class JournalTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("linnet_journal_" + std::to_string(::getpid()) + "_" +
                                        testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "out");
    path_ = (dir_ / "out" / "o.jsonl.journal").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  static ordered_json header(const char* command) {
    ordered_json h;
    h["linnet-tp journal"] = command;
    h["seed"] = 5;
    return h;
  }
  std::string error_of(const std::string& text, const char* command = "generate") {
    std::ofstream(path_, std::ios::binary) << text;
    try {
      read_journal(path_, command);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
  std::string path_;
};

TEST_F(JournalTest, AMissingFileHoldsNothing) {
  const JournalContents c = read_journal(path_, "generate");
  EXPECT_FALSE(c.exists);
  EXPECT_TRUE(c.lines.empty());
}

TEST_F(JournalTest, LinesComeBackInOrderAfterTheHeader) {
  {
    Journal j(path_, header("generate"));
    j.append(R"({"index":3,"completion":"a"})");
    j.append(R"({"index":0,"completion":"b"})");
  }
  const JournalContents c = read_journal(path_, "generate");
  EXPECT_TRUE(c.exists);
  EXPECT_EQ(c.header["seed"], 5);
  ASSERT_EQ(c.lines.size(), 2u);
  EXPECT_EQ(c.lines[0], (std::pair<int, std::string>{2, R"({"index":3,"completion":"a"})"}));
  EXPECT_EQ(c.lines[1].second, R"({"index":0,"completion":"b"})");
  EXPECT_TRUE(c.dropped.empty());
  EXPECT_EQ(c.whole_bytes, read_file(path_).size());
}

// A resume must have the settings of the run that wrote the journal: every key equal,
// none on one side only (an edited journal, or one of another version).
TEST_F(JournalTest, SettingsMustMatchKeyForKey) {
  JournalContents c;
  c.exists = true;
  c.header = header("generate");
  ordered_json had;
  had["model"] = "/m";
  had["max_new_tokens"] = 16;
  c.header["settings"] = had;
  EXPECT_NO_THROW(check_journal_settings(c, had, path_));

  ordered_json other = had;
  other["max_new_tokens"] = 17;
  try {
    check_journal_settings(c, other, path_);
    ADD_FAILURE() << "a changed setting passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path_ + ":1: --output was written by a run with other settings: "
                                               "max_new_tokens is 17 in this run and was 16 in that one"),
              std::string::npos)
        << e.what();
  }
  ordered_json fewer;
  fewer["model"] = "/m";
  try {
    check_journal_settings(c, fewer, path_);
    ADD_FAILURE() << "a setting only the journal has passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_new_tokens was 16 in that run and is not a setting of this one"),
              std::string::npos)
        << e.what();
  }
  ordered_json more = had;
  more["chat"] = true;
  EXPECT_THROW(check_journal_settings(c, more, path_), Error);
  c.header.erase("settings");  // an older journal: no check
  EXPECT_NO_THROW(check_journal_settings(c, more, path_));
}

// kill -9 while a line was written leaves it without its newline; a crash of the
// machine can leave garbage ending in one. Either way only the last line goes.
TEST_F(JournalTest, ATornLastLineIsDroppedNotFatal) {
  const std::string whole = header("generate").dump() + "\n{\"index\":1}\n";
  std::ofstream(path_, std::ios::binary) << whole << "{\"index\":2,\"compl";
  JournalContents c = read_journal(path_, "generate");
  ASSERT_EQ(c.lines.size(), 1u);
  EXPECT_EQ(c.whole_bytes, whole.size());
  EXPECT_NE(c.dropped.find(path_ + ":3: a last line without its newline (17 bytes"), std::string::npos) << c.dropped;

  std::ofstream(path_, std::ios::binary) << whole << std::string(9, '\0') << "\n";
  c = read_journal(path_, "generate");
  ASSERT_EQ(c.lines.size(), 1u);
  EXPECT_EQ(c.whole_bytes, whole.size());
  EXPECT_NE(c.dropped.find(path_ + ":3: a last line that is not JSON"), std::string::npos) << c.dropped;

  // Only the header, cut: nothing was finished.
  std::ofstream(path_, std::ios::binary) << "{\"linnet-tp jour";
  c = read_journal(path_, "generate");
  EXPECT_TRUE(c.exists);
  EXPECT_TRUE(c.header.is_null());
  EXPECT_EQ(c.whole_bytes, 0u);
}

TEST_F(JournalTest, DamageBeforeTheLastLineOrAnotherCommandIsRefused) {
  const std::string h = header("generate").dump() + "\n";
  EXPECT_NE(error_of(h + "{\"index\":1\n{\"index\":2}\n").find(path_ + ":2: the journal is damaged"),
            std::string::npos);
  EXPECT_NE(error_of(h + "{\"index\":1}\n", "loss").find("a journal of `linnet-tp generate`, not of `linnet-tp loss`"),
            std::string::npos);
  EXPECT_NE(error_of("{\"index\":1}\n{\"index\":2}\n").find(path_ + ":1: not a linnet-tp journal"), std::string::npos);
}

TEST_F(JournalTest, AFreshJournalNeverReplacesAnExistingOne) {
  std::ofstream(path_) << "{}\n";
  EXPECT_THROW(Journal(path_, header("generate")), Error);
  EXPECT_EQ(read_file(path_), "{}\n");
}

TEST_F(JournalTest, AResumedJournalContinuesAfterItsLastWholeLine) {
  const std::string whole = header("loss").dump() + "\n{\"pack\":0}\n";
  std::ofstream(path_, std::ios::binary) << whole << "{\"pack\":1,\"do";
  const JournalContents c = read_journal(path_, "loss");
  {
    Journal j(path_, header("loss"), &c);
    j.append("{\"pack\":1}");
  }
  EXPECT_EQ(read_file(path_), whole + "{\"pack\":1}\n");
  // A file holding not even its header gets one.
  std::ofstream(path_, std::ios::binary) << "{\"linn";
  const JournalContents empty = read_journal(path_, "loss");
  {
    Journal j(path_, header("loss"), &empty);
    j.append("{\"pack\":0}");
  }
  EXPECT_EQ(read_file(path_), header("loss").dump() + "\n{\"pack\":0}\n");
}

// A run whose mpirun was killed goes on appending for a few seconds: a second writer is
// refused while it holds the journal, and a resume waits for it (then reads what it left).
TEST_F(JournalTest, OneWriterAtATimeAndAResumeWaitsForIt) {
  EXPECT_FALSE(journal_in_use(path_)) << "no journal";
  auto writer = std::make_unique<Journal>(path_, header("generate"));
  writer->append("{\"index\":0}");
  EXPECT_TRUE(journal_in_use(path_)) << "a run that writes it now (a rerun without --resume is told so)";
  const JournalContents c = read_journal(path_, "generate");
  try {
    Journal second(path_, header("generate"), &c);
    ADD_FAILURE() << "a second writer was let in";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another linnet-tp run is writing this journal"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
  }
  try {
    wait_for_journal_writer(path_, 0.2);
    ADD_FAILURE() << "the wait returned while the writer held the journal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("still writing this journal"), std::string::npos) << e.what();
  }
  std::thread ends([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    writer->append("{\"index\":1}");
    writer.reset();  // the old run exits
  });
  const auto t0 = std::chrono::steady_clock::now();
  wait_for_journal_writer(path_, 30);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(250));
  ends.join();
  EXPECT_FALSE(journal_in_use(path_)) << "its writer is gone";
  EXPECT_EQ(read_journal(path_, "generate").lines.size(), 2u) << "the line written while it waited is read";
  wait_for_journal_writer((dir_ / "none.journal").string(), 0);  // no journal: nothing to wait for
}

// A FIFO in the journal's place would block open(2) forever; a symlink would append
// this run's lines to another run's journal: both refused by name.
TEST_F(JournalTest, AJournalMustBeAPlainFile) {
  ASSERT_EQ(::mkfifo(path_.c_str(), 0644), 0);
  EXPECT_THROW(wait_for_journal_writer(path_, 1), Error);
  try {
    read_journal(path_, "generate");
    ADD_FAILURE() << "a FIFO was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  fs::remove(path_);
  const std::string other = (dir_ / "other.journal").string();
  std::ofstream(other) << header("generate").dump() << "\n";
  fs::create_symlink(other, path_);
  EXPECT_THROW(read_journal(path_, "generate"), Error);
  EXPECT_THROW(wait_for_journal_writer(path_, 1), Error);
}

// An --output that is a symbolic link, its target not there yet: the target is the file
// written (the link was replaced by a regular file and its target never written), and the
// journal of every route to that file is one, so its one-writer lock holds two runs apart
// (a link and the target's own path both ran to the end).
TEST_F(JournalTest, AnOutputThroughADanglingLinkWritesItsTargetUnderOneLock) {
  const fs::path target = dir_ / "out" / "real.jsonl", link = dir_ / "link.jsonl", link2 = dir_ / "link2.jsonl";
  fs::create_symlink(fs::path("out") / "real.jsonl", link);  // relative, dangling
  fs::create_symlink(link, link2);                          // a chain
  const std::string real = fs::canonical(dir_ / "out").string() + "/real.jsonl";
  EXPECT_EQ(resolve_output_path(link.string()), real);
  EXPECT_EQ(resolve_output_path(link2.string()), real);
  EXPECT_EQ(resolve_output_path(target.string()), real);
  EXPECT_EQ(journal_path(link2.string()), journal_path(target.string()));
  {
    JsonlOutput out(link2.string());
    out.add("p", "c", {1}, {2}, "length");
    out.commit();
  }
  EXPECT_TRUE(fs::is_symlink(link)) << "the link is kept";
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(target)));
  EXPECT_NE(read_file(target).find("\"completion\":\"c\""), std::string::npos);
  Journal first(journal_path(target.string()), header("generate"));
  first.append("{\"index\":0}");
  // A second run through the link: without --resume the journal it finds stops it; with
  // --resume the lock does.
  EXPECT_TRUE(fs::exists(journal_path(link2.string())));
  const JournalContents c = read_journal(journal_path(link2.string()), "generate");
  try {
    Journal second(journal_path(link2.string()), header("generate"), &c);
    ADD_FAILURE() << "a second run writing the same file through a link was let in";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another linnet-tp run is writing this journal"), std::string::npos)
        << e.what();
  }
  // A loop, and a link into a folder that does not exist, are refused by name.
  fs::create_symlink(dir_ / "loop_b", dir_ / "loop_a");
  fs::create_symlink(dir_ / "loop_a", dir_ / "loop_b");
  EXPECT_THROW(resolve_output_path((dir_ / "loop_a").string()), Error);
  fs::create_symlink(dir_ / "nowhere" / "x.jsonl", dir_ / "lost.jsonl");
  try {
    resolve_output_path((dir_ / "lost.jsonl").string());
    ADD_FAILURE() << "a link into a missing folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("its directory does not exist"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nowhere"), std::string::npos) << e.what();
  }
}

TEST_F(JournalTest, RemoveDeletesIt) {
  Journal j(path_, header("generate"));
  j.append("{\"index\":0}");
  j.remove();
  EXPECT_FALSE(fs::exists(path_));
}

// The output folder removed mid-run: the journal goes on in TMPDIR with every line, and
// says where.
// A full disk: the journal goes on in TMPDIR with every line, the one whose write failed
// included. Needs a small tmpfs (root with CAP_SYS_ADMIN), else skipped.
TEST_F(JournalTest, AJournalOnAFullDiskMovesToTheTempFolder) {
  const fs::path small = dir_ / "small", rescue = dir_ / "tmp";
  fs::create_directories(small);
  fs::create_directories(rescue);
  if (::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=16k") != 0) {
    GTEST_SKIP() << "cannot mount a 16 KiB tmpfs to fill (" << std::strerror(errno) << ")";
  }
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  ::setenv("TMPDIR", rescue.c_str(), 1);
  const std::string path = (small / "o.jsonl.journal").string();
  std::string want = header("generate").dump() + "\n";
  {
    Journal j(path, header("generate"));
    for (int i = 0; i < 400; ++i) {  // ~40 KiB of lines into 16 KiB
      const std::string line = "{\"index\":" + std::to_string(i) + ",\"completion\":\"" + std::string(80, 'a') + "\"}";
      j.append(line);
      want += line + "\n";
    }
    EXPECT_TRUE(j.ok());
    EXPECT_TRUE(j.moved());
    EXPECT_EQ(fs::path(j.path()).parent_path(), rescue);
    EXPECT_NE(journal_note(&j).find("(moved there: a write to it failed (No space left on device)): put it back as " +
                                    path + " and rerun with --resume"),
              std::string::npos)
        << journal_note(&j);
    j.sync();
    EXPECT_EQ(read_file(j.path()), want);
  }
  ::umount(small.c_str());
  if (old) {
    ::setenv("TMPDIR", saved.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
}

TEST_F(JournalTest, AJournalWhoseFolderVanishesMovesToTheTempFolder) {
  const fs::path rescue = dir_ / "tmp";
  fs::create_directories(rescue);
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  ::setenv("TMPDIR", rescue.c_str(), 1);
  {
    Journal j(path_, header("generate"));
    j.append("{\"index\":0}");
    fs::remove_all(dir_ / "out");
    j.sync();
    EXPECT_TRUE(j.moved());
    EXPECT_TRUE(j.ok());
    EXPECT_EQ(j.original_path(), path_);
    EXPECT_EQ(fs::path(j.path()).parent_path(), rescue);
    j.append("{\"index\":1}");
    EXPECT_NE(journal_note(&j).find("put it back as " + path_ + " and rerun with --resume"), std::string::npos);
    const std::string moved = j.path();
    j.sync();
    EXPECT_EQ(read_file(moved), header("generate").dump() + "\n{\"index\":0}\n{\"index\":1}\n");
  }
  if (old) {
    ::setenv("TMPDIR", saved.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
}

}  // namespace
}  // namespace linnet
