#include "driver/resume.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "driver/jsonl_output.h"

namespace linnet {

using nlohmann::ordered_json;

ResumeState read_resume_state(const std::string& output, const std::string& input, bool resume, bool journaled,
                              const ResumeWords& words) {
  ResumeState st;
  if (!output.empty()) {
    check_output_path(output, input);
    if (journaled) st.journal_file = journal_path(output);
  }
  if (resume) {
    wait_for_journal_writer(st.journal_file);  // a killed mpirun's ranks may still be at work
    st.kept = read_output_lines(resolve_output_path(output), &st.kept_line);
    st.journal = read_journal(st.journal_file, words.command);
    st.settings_file = st.journal_file;
    if (!st.journal.exists && !st.kept.empty()) {  // a finished run's --output: its record
      st.journal.header = read_run_record(output, words.command);
      st.settings_file = run_record_path(output);
    }
    if (!st.journal.dropped.empty()) warn_once("ignoring " + st.journal.dropped + "; " + words.redone);
  } else if (!st.journal_file.empty() && std::filesystem::exists(st.journal_file)) {
    if (journal_in_use(st.journal_file)) {
      throw Error("another linnet-tp run is writing this --output now (it holds its journal); wait for it to "
                  "end, or stop it",
                  st.journal_file);
    }
    throw Error(std::string("an unfinished run left its journal here: give --resume to keep ") + words.keeps +
                    ", or remove the journal to start over",
                st.journal_file);
  }
  return st;
}

void check_kept_output_line(const std::string& line, const std::string& where, const Request& r, const Tokenizer& tok,
                            int64_t vocab_size, int64_t max_seq_len, const std::vector<int64_t>& eos) {
  const ordered_json j = ordered_json::parse(line);
  // Only the keys linnet-tp writes: a line edited by hand would end up in --output.
  for (const auto& [key, value] : j.items()) {
    static const std::set<std::string> written = {"index", "prompt", "completion", "prompt_ids", "completion_ids",
                                                  "finish_reason", "error", "prompt_tokens", "completion_tokens",
                                                  "logprobs"};
    if (!written.count(key)) {
      throw Error("a kept line has a key linnet-tp does not write: \"" + key + "\"; is it linnet-tp's output?",
                  where);
    }
  }
  if (!j.contains("prompt") || j["prompt"] != r.text) {
    throw Error("its prompt differs from " + r.where + "; is it the output of another input?", where);
  }
  for (const char* key : {"completion", "finish_reason"}) {
    if (!j.contains(key) || !j[key].is_string()) {
      throw Error(std::string("a kept line needs a string \"") + key + "\" (as linnet-tp writes it)", where);
    }
  }
  // Its values too, as an input line's are: ids of this model, a finish reason
  // linnet-tp writes, counts and a completion text that are those of its ids (an
  // edited id or text would reach --output).
  const int64_t vocab = vocab_size;
  auto ids_of = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_array()) {
      throw Error(std::string("a kept line needs a \"") + key + "\" list (as linnet-tp writes it)", where);
    }
    std::vector<int32_t> ids;
    for (const auto& v : j[key]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
        throw Error(std::string("its \"") + key + "\" holds " + v.dump() + ", not a token id of this model (0 to " +
                        std::to_string(vocab - 1) + "); was the line edited?",
                    where);
      }
      ids.push_back(v.get<int32_t>());
    }
    return ids;
  };
  Request probe;
  probe.ids = ids_of("prompt_ids");
  probe.settings = r.settings;
  const std::vector<int32_t> completion_ids = ids_of("completion_ids");
  const std::string finish = j["finish_reason"].get<std::string>();
  if (finish != "stop" && finish != "length" && finish != "error") {
    throw Error("its \"finish_reason\" is \"" + finish + "\" (linnet-tp writes stop, length or error)", where);
  }
  if ((finish == "error") != (j.contains("error") && j["error"].is_string())) {
    throw Error("a kept line has a string \"error\" exactly when its finish_reason is \"error\"", where);
  }
  for (const auto& [key, n] : {std::pair<const char*, size_t>{"prompt_tokens", probe.ids.size()},
                               {"completion_tokens", completion_ids.size()}}) {
    if (j.contains(key) && !(j[key].is_number_unsigned() && j[key].get<uint64_t>() == n)) {
      throw Error(std::string("its \"") + key + "\" is " + j[key].dump() + ", not the " + std::to_string(n) +
                      " ids it lists; was the line edited?",
                  where);
    }
  }
  std::string text;
  bool stopped = false;
  try {
    text = completion_text(tok, probe, completion_ids, stopped);
  } catch (const Error&) {
    text.clear();
  }
  if (text != j["completion"].get<std::string>()) {
    throw Error("its \"completion\" is not the text of its \"completion_ids\"; was the line edited?", where);
  }
  // A finish reason its ids bear out: "length" at the request's limit (its
  // max_new_tokens, or the context), "stop" at an EOS / stop token id or a stop string.
  if (finish != "error") {
    const int64_t n = static_cast<int64_t>(completion_ids.size());
    const int64_t limit =
        std::min<int64_t>(r.settings.max_new_tokens, max_seq_len - static_cast<int64_t>(probe.ids.size()));
    const int64_t last = completion_ids.empty() ? -1 : completion_ids.back();
    const bool stop_id = last >= 0 && (std::find(eos.begin(), eos.end(), last) != eos.end() ||
                                       std::find(r.settings.stop_token_ids.begin(),
                                                 r.settings.stop_token_ids.end(), last) !=
                                           r.settings.stop_token_ids.end());
    const bool ok = n <= limit && (finish == "length" ? n == limit : stop_id || stopped);
    if (!ok) {
      throw Error("its finish_reason \"" + finish + "\" does not fit its " + std::to_string(n) +
                      " completion ids (the limit is " + std::to_string(limit) + "); was the line edited?",
                  where);
    }
  }
}

}  // namespace linnet
