// --model NAME -> a local model directory. A user may give a path, a short name of a
// seed model (llama-3.1-8b-instruct, qwen3-4b, phi-3-mini-4k-instruct) or a Hugging
// Face id (meta-llama/Llama-3.1-8B-Instruct); weights are never downloaded at run time.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

namespace linnet {

/// Reads an environment variable; empty when unset. Injectable for tests.
using GetEnv = std::function<std::string(const char*)>;

/// The process environment.
std::string process_env(const char* name);

/// The Hugging Face id of a seed model's short name, or `name` itself.
std::string hf_repo_id(const std::string& name);

/// Resolves `name`, trying in order: an existing directory `name`; `<dir>/<name>` for
/// each dir of $LINNET_MODEL_PATH (colon-separated); then each Hugging Face hub cache
/// ($HF_HUB_CACHE, $HF_HOME/hub, $HOME/.cache/huggingface/hub):
/// `models--<org>--<name>/snapshots/<revision in refs/main>/`.
/// A name written as a path (absolute, ./ or ../) is only tried as a path.
/// @throws Error naming --model, listing every place tried and the
///   `huggingface-cli download <id>` command that would fetch the model.
std::filesystem::path resolve_model_dir(const std::string& name, const GetEnv& env = process_env);

}  // namespace linnet
