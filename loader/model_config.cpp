// config.json -> ModelConfig.
//
// Defaults follow transformers' LlamaConfig (configuration_llama.py): kv heads =
// attention heads, head_dim = hidden_size / heads, 2048 positions, rms_norm_eps 1e-6,
// rope_theta 10000, untied embeddings, hidden_act silu. A config that asks
// for a feature this build does not implement is refused by name rather than run
// with silently different math. Unknown fields are ignored (configs carry many
// training-only keys).
#include "loader/model_config.h"

#include <algorithm>
#include <regex>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "loader/file_io.h"
#include "loader/json_brief.h"

namespace linnet {

namespace {

using nlohmann::json;

// Far above any real model (Llama 3.1 405B: hidden_size 16384, 126 layers, vocabularies
// ~260k), and low enough that sizes multiplied together stay inside int64.
constexpr int64_t kMaxDimension = int64_t{1} << 26;  // hidden, intermediate, vocab, heads
constexpr int64_t kMaxLayers = int64_t{1} << 16;  // real models have <= ~130 layers

/// Typed access to one config object; every error names the source file and field.
class Fields {
 public:
  Fields(const json& j, const std::string& source) : j_(j), source_(source) {}

  /// The field's value, or nullptr when it is absent or JSON null.
  const json* get(const char* field) const {
    auto it = j_.find(field);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  [[noreturn]] void fail(const char* field, const std::string& what, const std::string& expected,
                         const std::string& actual) const {
    throw Error(what, source_ + ": field \"" + field + "\"", expected, actual);
  }

  void type_error(const char* field, const char* expected, const json& v) const {
    fail(field, "wrong JSON type", expected, std::string(v.type_name()) + " " + json_brief(v));
  }

  std::optional<int64_t> opt_int(const char* field) const {
    const json* v = get(field);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) type_error(field, "an integer", *v);
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(field, "integer out of range", "<= 2^63-1", json_brief(*v));
    return v->get<int64_t>();
  }

  /// A required integer > 0.
  int64_t positive_int(const char* field) const {
    const std::optional<int64_t> v = opt_int(field);
    if (!v) fail(field, "missing required field", "a positive integer", "absent");
    check_positive(field, *v);
    return *v;
  }

  /// An optional integer > 0, `fallback` when absent.
  int64_t positive_int_or(const char* field, int64_t fallback) const {
    const std::optional<int64_t> v = opt_int(field);
    if (!v) return fallback;
    check_positive(field, *v);
    return *v;
  }

  void check_positive(const char* field, int64_t v) const {
    if (v <= 0) fail(field, "impossible value", "> 0", std::to_string(v));
  }

  /// Refuses a size so large that products of sizes (weights, caches) would overflow.
  void check_at_most(const char* field, int64_t v, int64_t limit) const {
    if (v > limit)
      fail(field, "larger than this build supports", "<= " + std::to_string(limit),
           std::to_string(v));
  }

  /// An optional number > 0, `fallback` when absent.
  double positive_double_or(const char* field, double fallback) const {
    const json* v = get(field);
    if (!v) return fallback;
    if (!v->is_number()) type_error(field, "a number", *v);
    const double d = v->get<double>();
    if (!(d > 0)) fail(field, "impossible value", "> 0", json_brief(*v));
    return d;
  }

  std::optional<bool> opt_bool(const char* field) const {
    const json* v = get(field);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) type_error(field, "true or false", *v);
    return v->get<bool>();
  }

  std::optional<std::string> opt_string(const char* field) const {
    const json* v = get(field);
    if (!v) return std::nullopt;
    if (!v->is_string()) type_error(field, "a string", *v);
    return v->get<std::string>();
  }

  /// A token id field: an integer >= 0.
  std::optional<int64_t> opt_token_id(const char* field) const {
    const std::optional<int64_t> v = opt_int(field);
    if (v && *v < 0) fail(field, "impossible token id", ">= 0", std::to_string(*v));
    return v;
  }

  /// eos_token_id: an integer or a list of integers (Llama 3 lists several).
  std::vector<int64_t> token_id_list(const char* field) const {
    const json* v = get(field);
    if (!v) return {};
    std::vector<int64_t> ids;
    if (v->is_number_integer()) {
      ids.push_back(opt_token_id(field).value());
      return ids;
    }
    if (!v->is_array()) type_error(field, "an integer or a list of integers", *v);
    for (const json& e : *v) {
      if (!e.is_number_integer() || (!e.is_number_unsigned() && e.get<int64_t>() < 0))
        fail(field, "list entry is not a token id", "non-negative integers", json_brief(*v));
      ids.push_back(e.get<int64_t>());
    }
    return ids;
  }

  /// Refuses a feature: the field is present with a value this build cannot run.
  [[noreturn]] void not_implemented(const char* field, const std::string& expected,
                                    const json& v) const {
    fail(field, "not implemented in this build", expected, json_brief(v));
  }

 private:
  const json& j_;
  const std::string& source_;
};

// o[key] by reference, or a JSON null when absent (never a copy: a value may be nested
// arbitrarily deep, and copying it recurses as deep).
const json& at(const json& o, const char* key) {
  static const json kNull;
  if (!o.is_object()) return kNull;
  const auto it = o.find(key);
  return it == o.end() ? kNull : *it;
}

// o[key] when it is a string, else "".
std::string string_at(const json& o, const char* key) {
  const json& v = at(o, key);
  return v.is_string() ? v.get<std::string>() : std::string();
}

// What a config.json "quantization_config" describes, for the refusal: the method and, as
// far as the object says, the weights' format, type, bits and grouping, e.g.
// 'compressed-tensors, format "pack-quantized", weights int4, strategy "group", group_size
// 32'. Only string and integer values of the known keys are quoted; anything else is
// summarized by json_brief (bounded).
std::string describe_quantization(const json& q) {
  if (!q.is_object()) return json_brief(q);
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : ", ") + part; };
  auto int_of = [](const json& o, const char* key) -> std::string {
    const auto it = o.find(key);
    return it != o.end() && it->is_number_integer() ? std::to_string(it->get<int64_t>()) : std::string();
  };
  const std::string method = string_at(q, "quant_method");
  add(method.empty() ? std::string("an unnamed quant_method") : json_brief(json(method)));
  if (const std::string f = string_at(q, "format"); !f.empty()) add("format " + json_brief(json(f)));
  if (const std::string b = int_of(q, "bits"); !b.empty()) add(b + "-bit weights");
  if (const std::string g = int_of(q, "group_size"); !g.empty()) add("group_size " + g);
  if (const std::string a = string_at(q, "activation_scheme"); !a.empty()) add("activation_scheme " + json_brief(json(a)));
  const auto groups = q.find("config_groups");
  if (groups != q.end() && groups->is_object() && !groups->empty()) {
    const json& first = groups->begin().value();
    const auto w = first.is_object() ? first.find("weights") : first.end();
    if (first.is_object() && w != first.end() && w->is_object()) {
      const std::string type = string_at(*w, "type"), bits = int_of(*w, "num_bits");
      if (!type.empty() || !bits.empty()) add("weights " + type + bits);
      if (const std::string st = string_at(*w, "strategy"); !st.empty()) add("strategy " + json_brief(json(st)));
      if (const std::string g = int_of(*w, "group_size"); !g.empty()) add("group_size " + g);
    }
    if (groups->size() > 1) add(std::to_string(groups->size()) + " config_groups");
  }
  return out;
}

// config.json's "quantization_config": nullopt for compressed-tensors "dense" (float
// weights); the WeightQuantization of a supported "pack-quantized" scheme; anything
// else refused, naming the scheme (describe_quantization) and what is not supported.
std::optional<WeightQuantization> read_quantization(const Fields& f, const json& q) {
  const std::string what = describe_quantization(q);
  auto refuse = [&](const std::string& why) {
    f.fail("quantization_config",
           "this quantized checkpoint is not supported: " + why +
               " (linnet-tp reads compressed-tensors \"pack-quantized\" int4 / int8 and FP8 weight checkpoints, "
               "and f32, bf16, f16 weights; --weight-dtype int8 or int4 quantizes an unquantized checkpoint at load)",
           "compressed-tensors pack-quantized int4 (symmetric or with zero points) or int8 (symmetric), "
           "strategy group or channel; or FP8 weights (float-quantized / naive-quantized), per channel or tensor",
           what);
  };
  if (!q.is_object()) refuse("it is not an object");
  const auto absent = [](const json& o, const char* key) {
    const json& v = at(o, key);
    return v.is_null() || (v.is_object() && v.empty());
  };
  const std::string method = string_at(q, "quant_method");
  if (method != "compressed-tensors") refuse("quant_method " + json_brief(at(q, "quant_method")));
  const std::string format = string_at(q, "format");
  if (format == "dense") return std::nullopt;
  const bool float_format = format == "float-quantized" || format == "naive-quantized";
  if (format != "pack-quantized" && !float_format) refuse("format " + json_brief(at(q, "format")));
  if (const json& status = at(q, "quantization_status"); !status.is_null() && status != json("compressed"))
    refuse("quantization_status " + json_brief(status) + " (the weights are not stored compressed)");
  for (const char* key : {"kv_cache_scheme", "sparsity_config", "transform_config"})
    if (!absent(q, key)) refuse(std::string(key) + " " + json_brief(q[key]));
  const auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->size() != 1)
    refuse("config_groups must hold exactly one scheme");
  const json& g = groups->begin().value();
  if (!g.is_object()) refuse("config_groups entry is not an object");
  if (const std::string gf = string_at(g, "format"); !gf.empty() && gf != format) refuse("group format \"" + gf + "\"");
  const auto targets = g.find("targets");
  if (targets == g.end() || !targets->is_array() || std::find(targets->begin(), targets->end(), json("Linear")) == targets->end())
    refuse("targets must include \"Linear\" (every decoder projection quantized alike)");
  WeightQuantization out;
  if (!absent(g, "output_activations")) refuse("output_activations quantized (" + json_brief(g["output_activations"]) + ")");
  if (!absent(g, "input_activations")) {
    // FP8 weights with dynamic per-token FP8 activations ("FP8_DYNAMIC") run as the
    // weight-only computation; any other activation scheme is refused.
    const json& a = g["input_activations"];
    const bool fp8_dynamic = float_format && a.is_object() && at(a, "type") == json("float") &&
                             at(a, "num_bits") == json(8) && at(a, "dynamic") == json(true);
    if (!fp8_dynamic) refuse("input_activations quantized (" + json_brief(a) + "): only weight-only schemes run");
    out.activations_ignored = true;
  }
  const auto w = g.find("weights");
  if (w == g.end() || !w->is_object()) refuse("no weights scheme");
  if (float_format) {
    if (string_at(*w, "type") != "float" || !at(*w, "num_bits").is_number_integer() || at(*w, "num_bits") != json(8))
      refuse(format + " weights other than FP8 (type \"float\", 8 bits)");
    const std::string st = string_at(*w, "strategy");
    if (st != "channel" && st != "tensor") refuse("FP8 weights strategy " + json_brief(at(*w, "strategy")));
    if (const auto sym = w->find("symmetric"); sym != w->end() && *sym == json(false)) refuse("FP8 with zero points");
    if (!absent(*w, "actorder") || !absent(*w, "block_structure")) refuse("FP8 actorder / block_structure");
    out.fp8 = true;
    out.num_bits = 8;
    out.per_tensor = st == "tensor";
  }
  if (!float_format && string_at(*w, "type") != "int") refuse("weights type " + json_brief(at(*w, "type")));
  if (!out.fp8) {
    const auto bits = w->find("num_bits");
    if (bits == w->end() || !bits->is_number_integer() || (*bits != 4 && *bits != 8))
      refuse("weights num_bits " + json_brief(at(*w, "num_bits")) + " (4 or 8 run)");
    out.num_bits = bits->get<int64_t>();
    const json& sym = at(*w, "symmetric");
    if (!sym.is_null() && !sym.is_boolean()) refuse("weights symmetric " + json_brief(sym) + " (true or false)");
    out.symmetric = sym.is_null() || sym.get<bool>();
    if (!out.symmetric && out.num_bits == 8) refuse("int8 with zero points (asymmetric)");
    const std::string strategy = string_at(*w, "strategy");
    if (strategy == "group") {
      const auto gs = w->find("group_size");
      if (gs == w->end() || !gs->is_number_integer() || gs->get<int64_t>() < 1 || gs->get<int64_t>() > kMaxDimension)
        refuse("group_size " + json_brief(at(*w, "group_size")));
      out.group_size = gs->get<int64_t>();
      if (out.num_bits == 4 && out.group_size % 2 != 0) refuse("an odd int4 group_size");
    } else if (strategy != "channel") {
      refuse("weights strategy " + json_brief(at(*w, "strategy")));
    }
    if (!absent(*w, "actorder")) refuse("actorder " + json_brief((*w)["actorder"]) + " (g_idx)");
    if (!absent(*w, "block_structure")) refuse("block_structure");
  }
  if (const auto dyn = w->find("dynamic"); dyn != w->end() && !dyn->is_null() && *dyn != json(false))
    refuse("dynamic weights");
  // The lm_head must stay dense: every "ignore" entry names it ("lm_head" or a regex
  // "re:" ending in lm_head); any other module left out of the scheme is refused.
  bool head_ignored = false;
  if (const auto ig = q.find("ignore"); ig != q.end() && !ig->is_null()) {
    if (!ig->is_array()) refuse("ignore is not a list");
    for (const json& e : *ig) {
      const std::string name = e.is_string() ? e.get<std::string>() : std::string();
      // "lm_head", or a regex that can match only it: "re:" then optional "^" and ".*",
      // "lm_head", optional "$" (an alternation such as ".*|lm_head" matches every layer).
      static const std::regex kHeadOnly(R"(re:\^?(\.\*)?lm_head\$?)");
      const bool head = name == "lm_head" || std::regex_match(name, kHeadOnly);
      if (!head) refuse("ignore entry " + json_brief(e) + " (only the lm_head may stay unquantized)");
      head_ignored = true;
    }
  }
  if (!head_ignored) refuse("the lm_head is quantized (\"lm_head\" not in ignore)");
  return out;
}


// One RoPE object of config.json: "rope_scaling" (transformers 4) or "rope_parameters"
// (transformers 5; its "rope_theta" into `theta`). nullopt for the default RoPE; llama3
// scaling checked whole; any other type refused by name.
std::optional<RopeScaling> read_rope(const Fields& f, const std::string& source, const char* rope_field,
                                     const json& rs, double& theta) {
  if (!rs.is_object()) f.type_error(rope_field, "an object or null", rs);
  const std::string nested_source = source + " " + rope_field;
  const Fields r(rs, nested_source);
  const std::optional<std::string> rope_type = r.opt_string("rope_type");
  const std::optional<std::string> old_type = r.opt_string("type");
  if (rope_type && old_type && *rope_type != *old_type) {
    f.fail(rope_field, "\"rope_type\" and \"type\" disagree", *rope_type, *old_type);
  }
  const std::string type = rope_type.value_or(old_type.value_or("default"));
  if (std::string(rope_field) == "rope_parameters") {
    theta = r.positive_double_or("rope_theta", 0.0);
  }
  if (type == "default") return std::nullopt;
  if (type != "llama3") f.not_implemented(rope_field, "null, \"default\" or rope_type \"llama3\"", rs);
  RopeScaling s;
  s.rope_type = type;
  s.factor = r.positive_double_or("factor", 0.0);
  s.low_freq_factor = r.positive_double_or("low_freq_factor", 0.0);
  s.high_freq_factor = r.positive_double_or("high_freq_factor", 0.0);
  s.original_max_position_embeddings = r.positive_int_or("original_max_position_embeddings", 0);
  if (s.factor == 0.0 || s.low_freq_factor == 0.0 || s.high_freq_factor == 0.0 ||
      s.original_max_position_embeddings == 0) {
    f.fail(rope_field, "llama3 rope scaling needs factor, low_freq_factor, high_freq_factor and "
                       "original_max_position_embeddings", "all four > 0", json_brief(rs));
  }
  if (!(s.high_freq_factor > s.low_freq_factor)) {
    f.fail(rope_field, "high_freq_factor must exceed low_freq_factor", "high > low", json_brief(rs));
  }
  return s;
}

// The layer dimensions (hidden_size, intermediate_size, layers, heads, KV heads,
// head_dim), each positive and bounded; heads a multiple of KV heads; head_dim even.
void read_dimensions(const Fields& f, ModelConfig& c) {
  c.hidden_size = f.positive_int("hidden_size");
  f.check_at_most("hidden_size", c.hidden_size, kMaxDimension);
  c.intermediate_size = f.positive_int("intermediate_size");
  f.check_at_most("intermediate_size", c.intermediate_size, kMaxDimension);
  c.num_hidden_layers = f.positive_int("num_hidden_layers");
  f.check_at_most("num_hidden_layers", c.num_hidden_layers, kMaxLayers);
  c.num_attention_heads = f.positive_int("num_attention_heads");
  f.check_at_most("num_attention_heads", c.num_attention_heads, kMaxDimension);
  c.num_key_value_heads = f.positive_int_or("num_key_value_heads", c.num_attention_heads);
  f.check_at_most("num_key_value_heads", c.num_key_value_heads, kMaxDimension);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail("num_key_value_heads", "num_attention_heads is not a multiple of num_key_value_heads",
           "a divisor of num_attention_heads = " + std::to_string(c.num_attention_heads),
           std::to_string(c.num_key_value_heads));
  if (f.get("head_dim")) {
    c.head_dim = f.positive_int("head_dim");
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      f.fail("head_dim",
             "missing, and hidden_size is not a multiple of num_attention_heads = " +
                 std::to_string(c.num_attention_heads),
             "head_dim, or hidden_size divisible by num_attention_heads",
             "hidden_size " + std::to_string(c.hidden_size));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  f.check_at_most("head_dim", c.head_dim, kMaxDimension);
  // RoPE rotates pairs of dimensions (rotate_half splits head_dim in two halves).
  if (c.head_dim % 2 != 0)
    f.fail("head_dim",
           f.get("head_dim") ? "odd; RoPE needs an even head_dim"
                             : "odd (hidden_size / num_attention_heads); RoPE needs an even head_dim",
           "an even number", std::to_string(c.head_dim));
}

}  // namespace

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  if (!j.is_object()) throw Error("config is not a JSON object", source, "object", j.type_name());
  const Fields f(j, source);
  ModelConfig c;

  // Refusals first: a config for another architecture should say so, not complain
  // about a missing field.
  const char* kTypes = "\"llama\", \"mistral\", \"qwen3\" or \"phi3\"";
  const std::optional<std::string> model_type = f.opt_string("model_type");
  if (!model_type) f.fail("model_type", "missing required field", kTypes, "absent");
  if (*model_type != "llama" && *model_type != "mistral" && *model_type != "qwen3" && *model_type != "phi3")
    f.not_implemented("model_type", kTypes, j["model_type"]);
  c.model_type = *model_type;
  // Quantized checkpoints: compressed-tensors' "pack-quantized" int4 / int8 weights are
  // read (WeightQuantization); its "dense" format stores (fake-quantized) weights
  // unpacked, as floats: those load as they are. Everything else (GPTQ, AWQ, FP8,
  // bitsandbytes, other compressed-tensors formats and schemes) is refused by name.
  if (const json* q = f.get("quantization_config")) c.quantization = read_quantization(f, *q);
  c.qk_norm = c.model_type == "qwen3";
  c.fused_projections = c.model_type == "phi3";

  // RoPE: transformers 4 writes rope_theta + rope_scaling, transformers 5 rope_parameters
  // (rope_type, rope_theta and the scaling fields in one object). A config may carry both:
  // rope_parameters is the one used, but a scaling we do not implement in either (under
  // "rope_type" or the older "type") is refused rather than silently ignored.
  double theta_from_parameters = 0.0;
  std::optional<RopeScaling> from_scaling;
  if (const json* rs = f.get("rope_scaling")) from_scaling = read_rope(f, source, "rope_scaling", *rs, theta_from_parameters);
  if (const json* rp = f.get("rope_parameters")) {
    c.rope_scaling = read_rope(f, source, "rope_parameters", *rp, theta_from_parameters);
  } else {
    c.rope_scaling = from_scaling;
  }
  if (f.opt_bool("attention_bias").value_or(false))
    f.not_implemented("attention_bias", "false", j["attention_bias"]);
  if (f.opt_bool("mlp_bias").value_or(false)) f.not_implemented("mlp_bias", "false", j["mlp_bias"]);
  for (const char* act : {"hidden_act", "hidden_activation"}) {
    const std::optional<std::string> a = f.opt_string(act);
    if (a && *a != "silu") f.not_implemented(act, "\"silu\"", j[act]);
  }

  read_dimensions(f, c);
  c.vocab_size = f.positive_int("vocab_size");
  f.check_at_most("vocab_size", c.vocab_size, kMaxDimension);
  c.max_position_embeddings = f.positive_int_or("max_position_embeddings", 2048);
  c.rms_norm_eps = f.positive_double_or("rms_norm_eps", 1e-6);
  c.rope_theta = theta_from_parameters > 0.0 ? theta_from_parameters
                                             : f.positive_double_or("rope_theta", 10000.0);
  // Sliding window: Phi-3 and Mistral apply it to every layer; Qwen3 only with
  // use_sliding_window (a per-layer scheme not implemented here).
  if (c.model_type == "qwen3") {
    if (f.opt_bool("use_sliding_window").value_or(false))
      f.not_implemented("use_sliding_window", "false", j["use_sliding_window"]);
  } else if (c.model_type != "llama" && f.get("sliding_window")) {
    c.sliding_window = f.positive_int("sliding_window");
  }
  c.tie_word_embeddings = f.opt_bool("tie_word_embeddings").value_or(false);
  c.bos_token_id = f.opt_token_id("bos_token_id");
  c.eos_token_ids = f.token_id_list("eos_token_id");
  // Newer transformers write "dtype" instead of "torch_dtype".
  if (std::optional<std::string> d = f.opt_string("torch_dtype")) {
    c.torch_dtype = *d;
  } else if (const json* d2 = f.get("dtype"); d2 && d2->is_string()) {
    c.torch_dtype = d2->get<std::string>();
  }
  return c;
}

ModelConfig ModelConfig::from_text(std::string_view text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error("model config is not valid JSON", source, "a JSON object", e.what());
  }
  return from_json(j, source);
}

ModelConfig ModelConfig::load(const std::filesystem::path& path) {
  return from_text(read_text_file(path, "model config"), path.string());
}

std::string WeightQuantization::describe() const {
  if (fp8) {
    return std::string("compressed-tensors FP8 e4m3 weights, ") + (per_tensor ? "per tensor" : "per channel") +
           ", widened at load" + (activations_ignored ? " (dynamic FP8 input activations not applied)" : "");
  }
  return "compressed-tensors pack-quantized int" + std::to_string(num_bits) + ", " +
         (group_size > 0 ? "groups of " + std::to_string(group_size) : std::string("per channel")) + ", " +
         (symmetric ? "symmetric" : "with zero points");
}

}  // namespace linnet
