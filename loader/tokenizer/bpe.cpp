// The BPE model of tokenizer.json: one pre-tokenized word -> ids.
//
// Follows huggingface/tokenizers models/bpe/model.rs (merge_word, tokenize_with_cache)
// and word.rs (merge_all): characters -> vocabulary ids (byte fallback or unk for the
// missing ones), then merges applied from a priority queue ordered by (rank, position),
// with stale queue entries skipped when popped. Merges live in a hash map keyed by the
// pair of ids; encoded words are cached (words under 256 bytes, 10000 entries), as
// tokenizers does.
#include <algorithm>
#include <mutex>
#include <queue>

#include "common/error.h"
#include "loader/json_brief.h"
#include "loader/tokenizer/tokenizer_parts.h"

namespace linnet::tok {

struct BpeModel::Cache {
  static constexpr std::size_t kCapacity = 10000;
  static constexpr std::size_t kMaxWordBytes = 256;
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>> words;
};

BpeModel::BpeModel() : cache_(std::make_unique<Cache>()) {}
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

/// The (left, right) strings of merge number `rank`: "a b" or ["a", "b"].
std::pair<std::string, std::string> parse_merge(const Json& m, std::size_t rank,
                                                const std::string& where) {
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const std::size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      throw Error("merge " + std::to_string(rank) + " is not two tokens separated by one space",
                  where, "\"a b\"", "\"" + s + "\"");
    }
    return {s.substr(0, space), s.substr(space + 1)};
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  }
  throw Error("merge " + std::to_string(rank) + " is malformed", where,
              "\"a b\" or [\"a\", \"b\"]", json_brief(m));
}

}  // namespace

BpeModel BpeModel::from_json(const Json& j, const std::string& where) {
  const std::string ctx = where + " (model)";
  BpeModel m;
  m.where_ = ctx;
  if (!j.contains("vocab") || !j.at("vocab").is_object()) {
    throw Error("BPE model without a 'vocab' object", ctx);
  }
  for (const auto& [token, id_json] : j.at("vocab").items()) {
    const int32_t id = json_token_id(id_json, token, ctx + " vocab");
    m.vocab_.emplace(token, id);
    if (static_cast<std::size_t>(id) >= m.id_to_token_.size())
      m.id_to_token_.resize(static_cast<std::size_t>(id) + 1);
    if (!m.id_to_token_[id]) m.id_to_token_[id] = token;
  }

  auto optional_string = [&](const char* key) -> std::string {
    if (!j.contains(key) || j.at(key).is_null()) return {};
    return json_string(j, key, ctx);
  };
  auto flag = [&](const char* key) {
    if (!j.contains(key) || j.at(key).is_null()) return false;
    if (!j.at(key).is_boolean()) throw Error(std::string("'") + key + "' is not a boolean", ctx);
    return j.at(key).get<bool>();
  };
  m.continuing_subword_prefix_ = optional_string("continuing_subword_prefix");
  m.end_of_word_suffix_ = optional_string("end_of_word_suffix");
  m.fuse_unk_ = flag("fuse_unk");
  m.byte_fallback_ = flag("byte_fallback");
  m.ignore_merges_ = flag("ignore_merges");
  m.unk_token_ = optional_string("unk_token");
  if (!m.unk_token_.empty()) m.unk_id_ = m.token_to_id(m.unk_token_);
  if (j.contains("dropout") && !j.at("dropout").is_null()) {
    if (!j.at("dropout").is_number() || j.at("dropout").get<double>() != 0.0) {
      throw Error("BPE dropout is not supported (it makes encoding random)", ctx, "null",
                  json_brief(j.at("dropout")));
    }
  }

  m.byte_ids_.assign(256, -1);
  static const char* kHex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string name = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
    if (const auto id = m.token_to_id(name)) m.byte_ids_[b] = *id;
  }

  const Json& merges = json_field(j, "merges");  // absent or null: no merges
  if (!merges.is_array() && !merges.is_null())
    throw Error("'merges' is not an array", ctx, "array", merges.type_name());
  m.merges_.reserve(merges.size());
  const std::size_t prefix_len = m.continuing_subword_prefix_.size();
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto [left, right] = parse_merge(merges[rank], rank, ctx);
    const auto left_id = m.token_to_id(left);
    const auto right_id = m.token_to_id(right);
    const std::string merged = left + (right.size() >= prefix_len ? right.substr(prefix_len) : "");
    const auto merged_id = m.token_to_id(merged);
    if (!left_id || !right_id || !merged_id) {
      const std::string& missing = !left_id ? left : !right_id ? right : merged;
      throw Error("merge " + std::to_string(rank) + " (" + left + " " + right + ") uses '" +
                      missing + "', which is not in the vocabulary",
                  ctx);
    }
    // A later duplicate overwrites an earlier one, as collecting into a HashMap does.
    m.merges_[pair_key(*left_id, *right_id)] = MergeTarget{static_cast<int32_t>(rank), *merged_id};
  }
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return {};
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= id_to_token_.size() || !id_to_token_[id]) {
    return nullptr;
  }
  return &*id_to_token_[id];
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() < Cache::kMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    const auto it = cache_->words.find(std::string(word));
    if (it != cache_->words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (cache_->words.size() < Cache::kCapacity) cache_->words.emplace(word, std::move(ids));
  }
}

std::vector<BpeModel::Symbol> BpeModel::word_symbols(std::string_view word) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id, std::size_t len) {
    const auto n = static_cast<int64_t>(symbols.size());
    if (!symbols.empty()) symbols.back().next = n;
    symbols.push_back(Symbol{id, n - 1, -1, len});
  };
  auto unk_id = [&] {
    if (!unk_id_) {
      throw Error("unk_token '" + unk_token_ + "' is needed but not in the vocabulary",
                  where_);
    }
    return *unk_id_;
  };

  // A pending unk symbol, fused over consecutive unknown characters when fuse_unk.
  bool unk_pending = false;
  int32_t unk_token_id = 0;
  std::size_t unk_len = 0;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t byte_len = std::max<std::size_t>(1, utf8_length_at(word, i));
    const bool is_first = i == 0;
    const bool is_last = i + byte_len >= word.size();
    std::string s(word.substr(i, byte_len));
    i += byte_len;
    if (!is_first && !continuing_subword_prefix_.empty()) s = continuing_subword_prefix_ + s;
    if (is_last) s += end_of_word_suffix_;

    if (const auto id = token_to_id(s)) {
      if (unk_pending) {
        add(unk_token_id, unk_len);
        unk_pending = false;
      }
      add(*id, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : s) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        // Like model.rs, a pending unk is not flushed here: it lands after these bytes.
        for (char c : s) add(byte_ids_[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (!unk_token_.empty()) {
      if (unk_pending && fuse_unk_) {
        unk_len += byte_len;
      } else {
        if (unk_pending) add(unk_token_id, unk_len);
        unk_pending = true;
        unk_token_id = unk_id();
        unk_len = byte_len;
      }
    }
    // No unk token: the character is dropped, as tokenizers does.
  }
  if (unk_pending) add(unk_token_id, unk_len);
  return symbols;
}

void BpeModel::apply_merges(std::vector<Symbol>& symbols) const {
  struct Merge {
    std::size_t pos;
    int32_t rank;
    int32_t new_id;
  };
  // priority_queue puts the "largest" on top: make that the lowest rank, then lowest pos.
  auto later = [](const Merge& a, const Merge& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Merge, std::vector<Merge>, decltype(later)> queue(later);
  auto find = [&](int32_t left, int32_t right) -> const MergeTarget* {
    const auto it = merges_.find(pair_key(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (std::size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const MergeTarget* m = find(symbols[k].id, symbols[k + 1].id)) {
      queue.push(Merge{k, m->rank, m->new_id});
    }
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const auto next_pos = static_cast<std::size_t>(cur.next);
    const Symbol right = symbols[next_pos];
    // Skip entries made stale by an earlier merge of either side.
    const MergeTarget* still = find(cur.id, right.id);
    if (still == nullptr || still->new_id != top.new_id) continue;

    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0 && static_cast<std::size_t>(right.next) < symbols.size()) {
      symbols[static_cast<std::size_t>(right.next)].prev = static_cast<int64_t>(top.pos);
    }
    if (cur.prev >= 0) {
      const auto prev = static_cast<std::size_t>(cur.prev);
      if (const MergeTarget* m = find(symbols[prev].id, cur.id)) {
        queue.push(Merge{prev, m->rank, m->new_id});
      }
    }
    if (cur.next >= 0) {
      if (const MergeTarget* m = find(cur.id, symbols[static_cast<std::size_t>(cur.next)].id)) {
        queue.push(Merge{top.pos, m->rank, m->new_id});
      }
    }
  }
}

std::vector<int32_t> BpeModel::merge_word(std::string_view word) const {
  std::vector<Symbol> symbols = word_symbols(word);
  apply_merges(symbols);
  std::vector<int32_t> ids;
  ids.reserve(symbols.size());
  for (const Symbol& s : symbols) {
    if (s.len != 0) ids.push_back(s.id);
  }
  return ids;
}

}  // namespace linnet::tok
