// Checkpoint directories: one model.safetensors, or an index + shards.
//
// The name -> file table comes from weight_map when there is an index (as
// transformers loads it); tensors a shard holds but the index does not name are
// ignored, like transformers does.
#include "loader/checkpoint.h"

#include <algorithm>

#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "loader/file_io.h"
#include "loader/json_brief.h"

namespace linnet {

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

/// Problems listed by validate(); the rest are counted. A config for another model
/// can give one per tensor, millions for a big checkpoint.
constexpr std::size_t kMaxListedProblems = 20;

nlohmann::json read_json_file(const std::filesystem::path& path) {
  const std::string text = read_text_file(path, "checkpoint index");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error("not valid JSON", path.string(), "a JSON object", e.what());
  }
}

/// A shard name from weight_map must be a plain relative path inside the directory.
void check_shard_name(const std::string& shard, const std::string& tensor,
                      const std::string& index) {
  // A NUL would end the name at the open() call: "a.safetensors\0junk" opens a.safetensors.
  if (shard.find('\0') != std::string::npos)
    throw Error("weight_map entry for tensor '" + tensor + "' names a file with a NUL byte",
                index, "a file name without NUL", json_brief(nlohmann::json(shard)));
  const std::filesystem::path p(shard);
  bool ok = !shard.empty() && p.is_relative();
  for (const auto& part : p)
    if (part == "..") ok = false;
  if (!ok)
    throw Error("weight_map entry for tensor '" + tensor +
                    "' names a file outside the checkpoint directory",
                index, "a relative file name", json_brief(nlohmann::json(shard)));
}

}  // namespace

Checkpoint Checkpoint::open(const std::filesystem::path& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  const std::filesystem::path index_path = dir / kIndexName;
  const std::filesystem::path single_path = dir / kSingleName;

  if (std::filesystem::exists(index_path)) {
    const std::string index = index_path.string();
    const nlohmann::json j = read_json_file(index_path);
    if (!j.is_object())
      throw Error("checkpoint index is not a JSON object", index, "object", j.type_name());
    if (!j.contains("weight_map"))
      throw Error("checkpoint index lacks \"weight_map\"", index);
    const nlohmann::json& wm = j["weight_map"];
    if (!wm.is_object())
      throw Error("weight_map is not an object of tensor name -> file name", index, "object",
                  wm.type_name());

    // Open each distinct shard once, in name order (deterministic error reporting).
    std::map<std::string, const SafetensorsFile*> shards;
    for (const auto& [tensor, file] : wm.items()) {
      if (!file.is_string())
        throw Error("weight_map entry for tensor '" + tensor + "' is not a file name", index,
                    "string", file.type_name());
      const std::string shard = file.get<std::string>();
      check_shard_name(shard, tensor, index);
      shards.emplace(shard, nullptr);
    }
    for (auto& [shard, ptr] : shards) {
      const std::filesystem::path shard_path = dir / shard;
      if (!std::filesystem::exists(shard_path))
        throw Error("shard named by the checkpoint index does not exist", shard_path.string(),
                    "a file listed in " + index, "no such file");
      ck.files_.push_back(std::make_unique<SafetensorsFile>(shard_path));
      ptr = ck.files_.back().get();
    }
    for (const auto& [tensor, file] : wm.items()) {
      const SafetensorsFile* sf = shards.at(file.get<std::string>());
      const TensorInfo* info = sf->find(tensor);
      if (!info)
        throw Error("tensor '" + tensor + "' is mapped by " + index + " to " +
                        sf->path().string() + ", which does not contain it",
                    sf->path().string());
      ck.index_.emplace(tensor, std::make_pair(info, sf));
    }
    return ck;
  }

  if (std::filesystem::exists(single_path)) {
    ck.files_.push_back(std::make_unique<SafetensorsFile>(single_path));
    const SafetensorsFile* sf = ck.files_.back().get();
    for (const auto& [name, info] : sf->tensors()) ck.index_.emplace(name, std::make_pair(&info, sf));
    return ck;
  }

  throw Error(std::string("no checkpoint found: neither ") + kIndexName + " nor " + kSingleName +
                  " exists",
              dir.string());
}

std::pair<const TensorInfo*, const SafetensorsFile*> Checkpoint::find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return {nullptr, nullptr};
  return it->second;
}

std::vector<std::string> Checkpoint::validate(const std::vector<TensorSpec>& specs) const {
  std::vector<std::string> listed;  // the first kMaxListedProblems
  std::size_t n_problems = 0;
  // Checkpoint tensors some spec asked for: bounded by the checkpoint, not by the specs
  // (a wrong config can ask for millions).
  std::set<std::string, std::less<>> asked;
  for (const TensorSpec& spec : specs) {
    const auto [info, file] = find(spec.name);
    if (info) asked.insert(spec.name);
    const bool is_float = info && (info->dtype == DType::kF32 || info->dtype == DType::kF16 || info->dtype == DType::kBF16);
    const bool dtype_ok = info && (spec.dtypes.empty() ? is_float
                                                       : std::find(spec.dtypes.begin(), spec.dtypes.end(), info->dtype) != spec.dtypes.end());
    if (info && info->shape == spec.shape && dtype_ok) continue;
    if (n_problems++ >= kMaxListedProblems) continue;
    if (info && info->shape == spec.shape) {
      std::string want;
      for (DType d : spec.dtypes) want += std::string(want.empty() ? "" : " or ") + safetensors_dtype_name(d);
      listed.push_back(file->path().string() + ": tensor '" + spec.name + "' has the wrong dtype (expected " +
                       (want.empty() ? std::string("F32, F16 or BF16") : want) + ", got " +
                       safetensors_dtype_name(info->dtype) + ")");
    } else if (!info) {
      listed.push_back("missing tensor '" + spec.name + "' (expected shape " +
                       shape_str(spec.shape) + ")");
    } else {
      listed.push_back(file->path().string() + ": tensor '" + spec.name +
                       "' has the wrong shape (expected " + shape_str(spec.shape) + ", got " +
                       shape_str(info->shape) + ")");
    }
  }
  if (n_problems > 0) {
    std::ostringstream msg;
    msg << "checkpoint does not match the model (" << n_problems << " problem"
        << (n_problems == 1 ? "" : "s") << "):";
    for (const std::string& p : listed) msg << "\n  " << p;
    if (n_problems > listed.size()) msg << "\n  ... and " << n_problems - listed.size() << " more";
    throw Error(msg.str(), dir_.string());
  }
  std::vector<std::string> unused;
  for (const auto& [name, entry] : index_)
    if (!asked.contains(name)) unused.push_back(name);
  return unused;  // index_ is ordered, so this is sorted
}

void Checkpoint::read_f32(std::string_view name, const Slice2D& slice, float* out) const {
  read(name, slice, DType::kF32, out);
}

DType Checkpoint::dominant_dtype() const {
  // The dtypes a header may hold, in the order that breaks a tie.
  const DType kinds[3] = {DType::kF32, DType::kF16, DType::kBF16};
  uint64_t bytes[3] = {0, 0, 0};
  for (const auto& [name, entry] : index_) {
    for (int i = 0; i < 3; ++i) {
      if (entry.first->dtype == kinds[i]) bytes[i] += entry.first->end - entry.first->begin;
    }
  }
  const int best = static_cast<int>(std::max_element(bytes, bytes + 3) - bytes);
  return bytes[best] == 0 ? DType::kF32 : kinds[best];
}

void Checkpoint::read(std::string_view name, const Slice2D& slice, DType out_dtype, void* out) const {
  const auto [info, file] = find(name);
  if (!info) throw Error("tensor '" + std::string(name) + "' is not in the checkpoint", dir_.string());
  file->read(*info, slice, out_dtype, out);
  const bool two_d = info->shape.size() == 2;
  const uint64_t rows = two_d ? static_cast<uint64_t>(slice.row_end - slice.row_begin) : 1;
  bytes_read_ += rows * static_cast<uint64_t>(slice.col_end - slice.col_begin) * dtype_size(info->dtype);
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, entry] : index_) n += entry.first->end - entry.first->begin;
  return n;
}

}  // namespace linnet
