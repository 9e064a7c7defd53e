// The parts of `serve` that need no engine: request parsing and its errors (each names
// its parameter), the API key comparison, the streaming text's stop-string holdback,
// the metrics text, and the step plan's queue bound.
#include <gtest/gtest.h>

#include <chrono>

#include "launch/generate_requests.h"
#include "launch/openai_api.h"
#include "launch/serve_engine.h"
#include "tests/test_data.h"

namespace linnet {
namespace {

using nlohmann::json;

class ServeUnits : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(test::stories_dir())) GTEST_SKIP() << "no " << test::stories_dir();
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_dir(test::stories_dir()));
    model_.tokenizer = tok_.get();
    model_.model_dir = test::stories_dir();
    model_.chat_error = "no chat template";
    model_.served_name = "stories260k";
    model_.vocab_size = 512;
    limits_.max_seq_len = 512;
    limits_.max_n = 4;
    limits_.max_choices = 8;
    limits_.prompt_byte_limit = 512 * 64;
  }
  ApiRequest parse(const json& body, bool chat = false) const {
    return parse_api_request(body.dump(), chat, model_, limits_);
  }
  // The status and param of the ApiError `body` gets.
  std::pair<int, std::string> refusal(const std::string& body, bool chat = false) const {
    try {
      parse_api_request(body, chat, model_, limits_);
    } catch (const ApiError& e) {
      const json j = json::parse(dump_json(e.body()));
      EXPECT_TRUE(j["error"]["message"].is_string());
      return {e.status(), e.param()};
    }
    ADD_FAILURE() << "accepted: " << body;
    return {0, ""};
  }
  std::unique_ptr<Tokenizer> tok_;
  ApiModel model_;
  ApiLimits limits_;
};

TEST_F(ServeUnits, CompletionKeysBecomeRequestSettings) {
  const ApiRequest r = parse({{"prompt", json::array({"a b", "c"})}, {"max_tokens", 7}, {"temperature", 0.5},
                              {"top_k", -1}, {"stop", "x"}, {"seed", 3}, {"n", 2}, {"logprobs", 2}, {"echo", true}});
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(*r.seed, 3u);
  const RequestSettings& s = r.prompts[0].settings;
  EXPECT_EQ(s.max_new_tokens, 7);
  EXPECT_EQ(s.sampling.temperature, 0.5);
  EXPECT_EQ(s.sampling.top_k, 0);
  EXPECT_EQ(s.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(s.top_logprobs, 2);
  EXPECT_EQ(r.prompts[0].ids, tok_->encode("a b", true));
  // Defaults: 16 new tokens for completions, the rest of the context for chat-like use.
  EXPECT_EQ(parse({{"prompt", "a"}}).prompts[0].settings.max_new_tokens, 16);
  const ApiRequest ids = parse({{"prompt", json::array({1, 2, 3})}});
  EXPECT_EQ(ids.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
}

TEST_F(ServeUnits, RefusalsNameTheParameter) {
  EXPECT_EQ(refusal("{"), (std::pair<int, std::string>{400, ""}));
  EXPECT_EQ(refusal(std::string(20000, '[') + std::string(20000, ']')).first, 400);
  EXPECT_EQ(refusal("[1]").first, 400);
  EXPECT_EQ(refusal(R"({"prompt": "a", "prompt": "b"})").first, 400);  // duplicate key
  EXPECT_EQ(refusal(R"({"prompt": "a", "foo": 1})").second, "foo");
  EXPECT_EQ(refusal(R"({"prompt": "a", "temperature": "hot"})").second, "temperature");
  EXPECT_EQ(refusal(R"({"prompt": "a", "top_p": 1.5})").second, "top_p");
  EXPECT_EQ(refusal(R"({"prompt": "a", "min_p": -1})").second, "min_p");
  EXPECT_EQ(refusal(R"({"prompt": "a", "top_k": -2})").second, "top_k");
  EXPECT_EQ(refusal(R"({"prompt": "a", "frequency_penalty": -2.5})").second, "frequency_penalty");
  EXPECT_EQ(refusal(R"({"prompt": "a", "max_tokens": 1.5})").second, "max_tokens");
  EXPECT_EQ(refusal(R"({"prompt": "a", "max_tokens": 600})").second, "max_tokens");
  EXPECT_EQ(refusal(R"({"prompt": "a", "n": 9})").second, "n");
  EXPECT_EQ(refusal(R"({"prompt": ["a", "b", "c"], "n": 3})").second, "prompt");
  EXPECT_EQ(refusal(R"({"prompt": "a", "stop": ["x", ""]})").second, "stop");
  EXPECT_EQ(refusal(R"({"prompt": "a", "stop_token_ids": [600]})").second, "stop_token_ids");
  EXPECT_EQ(refusal(R"({"prompt": "a", "stream": 1})").second, "stream");
  EXPECT_EQ(refusal(R"({"prompt": "a", "echo": "yes"})").second, "echo");
  EXPECT_EQ(refusal(R"({"prompt": [[1, 2], "a"]})").second, "prompt");
  EXPECT_EQ(refusal(R"({"prompt": [-1]})").second, "prompt");
  EXPECT_EQ(refusal(R"({"prompt": "a", "best_of": 2})").second, "best_of");
  EXPECT_EQ(refusal(R"({"prompt": "a", "model": "x"})"), (std::pair<int, std::string>{404, "model"}));
  EXPECT_EQ(refusal(R"({"messages": [{"role": "user", "content": "hi"}]})", true).second, "messages");
  EXPECT_EQ(refusal(R"({"messages": [{"content": "hi"}]})", true).second, "messages");
  EXPECT_EQ(refusal(R"({"messages": [], "top_logprobs": 2})", true).second, "top_logprobs");
  EXPECT_EQ(refusal(R"({"messages": [], "echo": true})", true).second, "echo");  // not a chat key
}

TEST(ServeApi, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("sesame", "sesame"));
  EXPECT_FALSE(constant_time_equal("sesame", "sesamf"));
  EXPECT_FALSE(constant_time_equal("sesame", "sesame "));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_TRUE(constant_time_equal("", ""));
}

TEST(ServeApi, ErrorObject) {
  const json j = json::parse(dump_json(ApiError(429, "full", "", "", "queue_full").body()));
  EXPECT_EQ(j["error"]["type"], "rate_limit_exceeded");
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_EQ(j["error"]["code"], "queue_full");
  EXPECT_EQ(json::parse(dump_json(ApiError(400, "bad", "n").body()))["error"]["param"], "n");
  EXPECT_EQ(sse_frame(json{{"a", 1}}), "data: {\"a\":1}\n\n");
}

// The streamed text holds back what could start a stop string and ends before it; the
// pieces add up to completion_text.
TEST_F(ServeUnits, CompletionStreamHoldsBackStopStrings) {
  Request r;
  r.ids = tok_->encode("Once upon a time", true);
  r.settings.stop = {"girl named"};
  std::vector<int32_t> ids = tok_->encode(", there was a little girl named Lily. She", false);
  CompletionStream stream(*tok_, r);
  std::string shown;
  for (int32_t id : ids) {
    shown += stream.push(id);
    EXPECT_EQ(shown.find("girl"), std::string::npos) << shown;
  }
  shown += stream.finish();
  bool stopped = false;
  EXPECT_EQ(shown, completion_text(*tok_, r, ids, stopped));
  EXPECT_TRUE(stopped);
  EXPECT_TRUE(stream.stopped());
  EXPECT_NE(shown.find("little"), std::string::npos) << shown;
}

// A long stop string that the text keeps almost matching: each new token searched the
// last 2 x |stop| bytes with std::string::find, O(|stop|^2) per token (20000 tokens
// against a stop string of 5001 bytes took a minute).
TEST_F(ServeUnits, StopStringsAreScannedInLinearTime) {
  const int32_t a = tok_->token_to_id("a").value();
  Request r;
  r.ids = tok_->encode("Once", true);
  r.settings.stop = {std::string(5000, 'a') + "b"};
  const std::vector<int32_t> ids(20000, a);
  const auto start = std::chrono::steady_clock::now();
  CompletionStream stream(*tok_, r);
  StopScan scan;
  std::string shown;
  for (int32_t id : ids) {
    shown += stream.push(id);
    EXPECT_FALSE(scan.push(*tok_, r, id));
  }
  shown += stream.finish();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  bool stopped = true;
  EXPECT_EQ(shown, completion_text(*tok_, r, ids, stopped));
  EXPECT_FALSE(stopped);
  EXPECT_EQ(shown, std::string(20000, 'a'));
}

// text_offset counts characters (code points), as OpenAI and vLLM do, not UTF-8 bytes.
TEST_F(ServeUnits, TextOffsetCountsCharacters) {
  EXPECT_EQ(utf8_chars("a"), 1u);
  EXPECT_EQ(utf8_chars("\xc3\xa9t\xc3\xa9"), 3u);  // "été"
  EXPECT_EQ(utf8_chars("\xe6\x97\xa5\xe6\x9c\xac"), 2u);
  const std::vector<int32_t> ids = tok_->encode("caf\xc3\xa9 au lait \xe6\x97\xa5", false);
  std::vector<TokenLogprobs> lps(ids.size());
  size_t end = 0;
  const json j = json::parse(dump_json(completion_logprobs(*tok_, {}, nullptr, ids, lps, 0, 5, &end)));
  ASSERT_EQ(j["text_offset"].size(), ids.size());
  size_t chars = 5, bytes = 5;
  for (size_t k = 0; k < ids.size(); ++k) {
    EXPECT_EQ(j["text_offset"][k].get<size_t>(), chars) << k;
    const std::string t = j["tokens"][k].get<std::string>();
    chars += utf8_chars(t);
    bytes += t.size();
  }
  EXPECT_EQ(end, chars);
  EXPECT_LT(chars, bytes);  // the non-ASCII tokens count one per character
}

TEST(ServeEngine, QueueBoundsInFlightChoices) {
  ServeQueue q(3);
  auto ch = std::make_shared<ServeChannel>();
  EXPECT_EQ(q.submit(std::vector<ServeChoice>(2), ch), ServeQueue::Admit::kOk);
  EXPECT_EQ(q.submit(std::vector<ServeChoice>(2), ch), ServeQueue::Admit::kFull);
  EXPECT_EQ(q.submit(std::vector<ServeChoice>(4), ch), ServeQueue::Admit::kTooMany);  // never fits
  EXPECT_EQ(q.take(std::chrono::milliseconds(0)).size(), 1u);
  q.finished(2);
  EXPECT_EQ(q.submit(std::vector<ServeChoice>(3), ch), ServeQueue::Admit::kOk);
  q.close();
  EXPECT_EQ(q.submit(std::vector<ServeChoice>(1), ch), ServeQueue::Admit::kClosed);
}

TEST(ServeEngine, MetricsText) {
  ServeMetrics m;
  m.request_done("finished");
  m.step(3);
  m.first_token(0.02);
  m.engine_state(2, 1, 5, 128, 64);
  const std::string t = m.render();
  EXPECT_NE(t.find("linnet_requests_total{outcome=\"finished\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("linnet_kv_pages_in_use 5\n"), std::string::npos);
  EXPECT_NE(t.find("linnet_step_sequences_max 3\n"), std::string::npos);
  EXPECT_NE(t.find("linnet_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("linnet_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE linnet_inter_token_latency_seconds histogram"), std::string::npos);
}

}  // namespace
}  // namespace linnet
