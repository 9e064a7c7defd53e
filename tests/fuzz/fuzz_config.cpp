// Fuzz target: config.json -> ModelConfig (and the same text as generation_config.json).
//
// An accepted config must satisfy what ModelConfig::from_json promises: positive sizes
// under the build's limits, an even head_dim, attention heads a multiple of KV heads.
#include <cmath>
#include <cstdint>
#include <string_view>

#include "loader/generation_config.h"
#include "loader/model_config.h"
#include "tests/fuzz/fuzz_util.h"

using namespace linnet;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const ModelConfig c = ModelConfig::from_text(text, "fuzz/config.json");
    constexpr int64_t kDim = int64_t{1} << 26;
    for (const int64_t v : {c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                            c.head_dim, c.vocab_size}) {
      if (v <= 0 || v > kDim) fuzz::fail("a size out of range: " + std::to_string(v));
    }
    if (c.num_hidden_layers <= 0 || c.num_hidden_layers > (int64_t{1} << 20)) fuzz::fail("num_hidden_layers");
    if (c.head_dim % 2 != 0) fuzz::fail("odd head_dim");
    if (c.num_attention_heads % c.num_key_value_heads != 0) fuzz::fail("heads not a multiple of KV heads");
    if (c.max_position_embeddings <= 0) fuzz::fail("max_position_embeddings <= 0");
    if (c.sliding_window && *c.sliding_window <= 0) fuzz::fail("sliding_window <= 0");
    if (!(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0)) fuzz::fail("rms_norm_eps not finite and > 0");
    if (!(std::isfinite(c.rope_theta) && c.rope_theta > 0)) fuzz::fail("rope_theta not finite and > 0");
    if (c.rope_scaling && !(std::isfinite(c.rope_scaling->factor) && c.rope_scaling->factor > 0)) {
      fuzz::fail("rope_scaling factor not finite and > 0");
    }
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  try {
    const GenerationConfig g = GenerationConfig::from_text(text, "fuzz/generation_config.json");
    if (g.top_p && !(*g.top_p > 0 && *g.top_p <= 1)) fuzz::fail("top_p out of (0, 1]");
    if (g.temperature && !(*g.temperature >= 0)) fuzz::fail("temperature < 0");
    for (const int64_t id : g.eos_token_ids) {
      if (id < 0) fuzz::fail("negative eos id");
    }
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  return 0;
}
