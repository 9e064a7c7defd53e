// The parts of `serve` that need no engine: request parsing and its errors (each names
// its parameter), the API key comparison, the streaming text's stop-string holdback,
// the metrics text, and the step plan's queue bound.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/utf8.h"
#include "requests/request.h"
#include "server/http/http_framing.h"
#include "requests/jsonl_input.h"
#include "server/openai_api.h"
#include "requests/request_queue.h"
#include "requests/serve_metrics.h"
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

// Integers from 2^63 up (which nlohmann reads as unsigned, or beyond 2^64 as floats) are
// no counts: each is a 400 naming its parameter, never a wrapped negative value.
// The refusals say what the server wants: an HTTP body that is a JSON array was told
// "each line must be a JSON object" (a JSONL file's wording); chat messages as a
// completions prompt were told only "expected token ids".
TEST_F(ServeUnits, RefusalsSayWhatIsExpected) {
  auto message = [&](const std::string& body) {
    try {
      parse_api_request(body, false, model_, limits_);
    } catch (const ApiError& e) {
      return json::parse(dump_json(e.body()))["error"]["message"].get<std::string>();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message("[1]"), "the request body must be a JSON object, not a JSON array");
  EXPECT_EQ(message("\"hi\""), "the request body must be a JSON object, not a JSON string");
  const std::string any = "a string, a list of strings, a list of token ids, or a list of lists of ids";
  const std::string chat = message(R"({"prompt": [{"role": "user", "content": "hi"}]})");
  EXPECT_NE(chat.find(any), std::string::npos) << chat;
  EXPECT_NE(chat.find("chat messages go to /v1/chat/completions as \"messages\""), std::string::npos) << chat;
  EXPECT_NE(message(R"({"prompt": [true]})").find(any), std::string::npos);
  EXPECT_NE(message(R"({"prompt": [1, "a"]})").find("token ids in [0, 512)"), std::string::npos);
}

// POST /tokenize and /detokenize as vLLM offers them: the tokenizer's own ids (the
// oracle: the tokenizer's tests against HF tokenizers and llama.cpp's vectors), the chat
// template for messages, the same limits and refusals as generation.
TEST_F(ServeUnits, TokenizeAndDetokenizeAsVllm) {
  auto tokenize = [&](const json& body) { return json::parse(tokenize_response(body.dump(), model_, limits_)); };
  auto refused = [&](const json& body, bool detok = false) {
    try {
      if (detok) {
        detokenize_response(body.dump(), model_, limits_);
      } else {
        tokenize_response(body.dump(), model_, limits_);
      }
    } catch (const ApiError& e) {
      return std::pair<int, std::string>{e.status(), e.param()};
    }
    return std::pair<int, std::string>{0, "accepted"};
  };
  const json t = tokenize({{"prompt", "Once upon a time"}});
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), tok_->encode("Once upon a time", true));
  EXPECT_EQ(t["count"], t["tokens"].size());
  EXPECT_EQ(t["max_model_len"], limits_.max_seq_len);
  EXPECT_TRUE(t["token_strs"].is_null());
  const json plain = tokenize({{"prompt", "Once"}, {"add_special_tokens", false}, {"return_token_strs", true}});
  EXPECT_EQ(plain["tokens"].get<std::vector<int32_t>>(), tok_->encode("Once", false));
  EXPECT_EQ(plain["token_strs"][0], tok_->id_to_token(plain["tokens"][0].get<int32_t>()));
  const json back = json::parse(detokenize_response(json{{"tokens", t["tokens"]}}.dump(), model_, limits_));
  EXPECT_EQ(back["prompt"], tok_->decode(t["tokens"].get<std::vector<int32_t>>(), false));
  EXPECT_EQ(refused({{"prompt", "a"}, {"messages", json::array()}}).second, "messages");
  EXPECT_EQ(refused(json::object()).second, "prompt");
  EXPECT_EQ(refused({{"prompt", "a"}, {"foo", 1}}).second, "foo");
  EXPECT_EQ(refused({{"prompt", 5}}).second, "prompt");
  EXPECT_EQ(refused({{"prompt", "a"}, {"model", "other"}}), (std::pair<int, std::string>{404, "model"}));
  EXPECT_EQ(refused({{"prompt", std::string(static_cast<size_t>(limits_.prompt_byte_limit) + 1, 'a')}}).second,
            "prompt");
  EXPECT_EQ(refused({{"tokens", {1, 512}}}, true).second, "tokens");
  EXPECT_EQ(refused({{"tokens", "1 2"}}, true).second, "tokens");
  EXPECT_EQ(refused({{"tokens", std::vector<int>(static_cast<size_t>(limits_.max_seq_len) + 1, 1)}}, true).second,
            "tokens");
}

TEST_F(ServeUnits, HugeIntegersAreRefusedNamingTheParameter) {
  for (const char* big : {"9223372036854775808", "18446744073709551615", "18446744073709551616", "1e30"}) {
    const std::string b(big);
    EXPECT_EQ(refusal(R"({"prompt": "a", "max_tokens": )" + b + "}").second, "max_tokens") << b;
    EXPECT_EQ(refusal(R"({"prompt": "a", "n": )" + b + "}").second, "n") << b;
    EXPECT_EQ(refusal(R"({"prompt": "a", "logprobs": )" + b + "}").second, "logprobs") << b;
    EXPECT_EQ(refusal(R"({"prompt": [1, )" + b + "]}").second, "prompt") << b;
    EXPECT_EQ(refusal(R"({"prompt": [[1], [2, )" + b + "]]}").second, "prompt") << b;
    EXPECT_EQ(refusal(R"({"prompt": "a", "top_k": )" + b + "}").second, "top_k") << b;
    EXPECT_EQ(refusal(R"({"prompt": "a", "stop_token_ids": [)" + b + "]}").second, "stop_token_ids") << b;
    EXPECT_EQ(refusal(R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": )" + b +
                          "}",
                      true)
                  .second,
              "top_logprobs")
        << b;
    EXPECT_EQ(refusal(R"({"messages": [], "max_completion_tokens": )" + b + "}", true).second,
              "max_completion_tokens")
        << b;
  }
  // The seed takes the whole uint64 range; beyond it, or negative, is a 400.
  EXPECT_EQ(*parse(json::parse(R"({"prompt": "a", "seed": 18446744073709551615})")).seed, UINT64_MAX);
  EXPECT_EQ(*parse(json::parse(R"({"prompt": "a", "seed": 9223372036854775808})")).seed, uint64_t{1} << 63);
  EXPECT_EQ(refusal(R"({"prompt": "a", "seed": 18446744073709551616})").second, "seed");
  EXPECT_EQ(refusal(R"({"prompt": "a", "seed": -1})").second, "seed");
  EXPECT_EQ(refusal(R"({"prompt": "a", "seed": -9223372036854775808})").second, "seed");
  // The largest count still works where the value is bounded otherwise.
  EXPECT_EQ(refusal(R"({"prompt": "a", "max_tokens": 9223372036854775807})").second, "max_tokens");
}

// A body object of many distinct keys parses in O(n log n): 1 MB in well under a second
// (ordered_json's operator[] made the parse O(keys^2), about a minute for this).
TEST_F(ServeUnits, ManyKeysParseFast) {
  std::string body = "{";
  for (int i = 0; body.size() < (1u << 20); ++i) body += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
  body += "}";
  std::string nested = R"({"prompt": "a", "x": )" + body + "}";
  std::string dup = body.substr(0, body.size() - 1) + ",\"k0\":1}";
  const auto t0 = std::chrono::steady_clock::now();
  const nlohmann::ordered_json j = parse_jsonl_line(body, "body");
  EXPECT_GT(j.size(), 80000u);
  EXPECT_EQ(j.begin().key(), "k0");  // file order kept
  EXPECT_EQ(refusal(body).first, 400);  // unknown parameter
  EXPECT_EQ(refusal(nested).second, "x");
  try {
    parse_jsonl_line(dup, "body");
    ADD_FAILURE() << "a repeated key was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate key"), std::string::npos) << e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 1.0) << "4 parses of 1 MB of distinct keys";
}

// --- the HTTP framing in front of httplib ----------------------------------------------

using Framer = RequestFramer;

std::vector<Framer::Message> frame_all(Framer& f, const std::string& bytes, size_t piece = 0) {
  std::vector<Framer::Message> out;
  auto drain = [&] {
    while (f.advance() == Framer::Status::kReady) out.push_back(f.take());
  };
  if (piece == 0) {
    f.append(bytes.data(), bytes.size());
    drain();
  } else {
    for (size_t i = 0; i < bytes.size(); i += piece) {
      f.append(bytes.data() + i, std::min(piece, bytes.size() - i));
      drain();
    }
  }
  return out;
}

const std::string kPost = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";

TEST(ServeFraming, PipelinedRequestsComeOutInOrder) {
  for (size_t piece : {size_t{0}, size_t{1}, size_t{7}}) {
    Framer f({});
    const std::string two = kPost + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + "\r\n" + kPost;
    const auto m = frame_all(f, two, piece);
    ASSERT_EQ(m.size(), 3u) << piece;
    EXPECT_EQ(m[0].method, "POST");
    EXPECT_EQ(m[0].bytes, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    EXPECT_EQ(m[1].method, "GET");
    EXPECT_EQ(m[1].bytes, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(m[2].bytes, m[0].bytes);
    EXPECT_FALSE(m[0].close);
    EXPECT_EQ(f.buffered(), 0u);
    EXPECT_FALSE(f.started());
  }
}

TEST(ServeFraming, ChunkedBodiesWithTrailersBecomeContentLength) {
  Framer f({});
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n"
                          "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: abc\r\nX-More: 1\r\n\r\n";
  for (size_t piece : {size_t{0}, size_t{1}, size_t{3}}) {
    Framer g({});
    const auto m = frame_all(g, req + kPost, piece);
    ASSERT_EQ(m.size(), 2u) << piece;
    EXPECT_EQ(m[0].bytes, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world");
    EXPECT_EQ(m[1].bytes, kPost);
  }
  // No trailer, bare LF line ends.
  const auto m = frame_all(f, "POST / HTTP/1.1\nTransfer-Encoding: chunked\n\n3\nabc\n0\n\n");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].bytes, "POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
}

TEST(ServeFraming, HeadRewrite) {
  Framer f({});
  const auto m = frame_all(f,
                           "\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\nRange: bytes=0-5\r\nIf-Range: x\r\n"
                           "Connection: keep-alive, Close\r\nAccept:  */*  \r\n\r\n");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].bytes, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAccept: */*\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(m[0].close);
  // A POST without a length has an empty body; a GET's body is dropped.
  Framer g({});
  const auto n = frame_all(g, "POST /a HTTP/1.0\r\n\r\nGET /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyzGET /c HTTP/1.1\r\n\r\n");
  ASSERT_EQ(n.size(), 3u);
  EXPECT_EQ(n[0].bytes, "POST /a HTTP/1.0\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(n[0].close);  // HTTP/1.0
  EXPECT_EQ(n[1].bytes, "GET /b HTTP/1.1\r\n\r\n");
  EXPECT_EQ(n[2].bytes, "GET /c HTTP/1.1\r\n\r\n");
  // The absolute form is taken as its path (RFC 9112 3.2.2).
  Framer h({});
  const auto a = frame_all(h, "GET http://127.0.0.1:8000/health HTTP/1.1\r\n\r\nGET HTTP://x HTTP/1.1\r\n\r\n");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].bytes, "GET /health HTTP/1.1\r\n\r\n");
  EXPECT_EQ(a[1].bytes, "GET / HTTP/1.1\r\n\r\n");
}

TEST(ServeFraming, ExpectContinue) {
  Framer f({});
  const std::string head = "POST /v1/completions HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n";
  f.append(head.data(), head.size());
  EXPECT_EQ(f.advance(), Framer::Status::kNeedMore);
  EXPECT_TRUE(f.head_done());
  EXPECT_TRUE(f.wants_continue());
  f.append("abc", 3);
  ASSERT_EQ(f.advance(), Framer::Status::kReady);
  EXPECT_EQ(f.take().bytes, "POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
}

TEST(ServeFraming, RefusalsHaveTheirStatus) {
  FramingLimits limits;
  limits.max_head_bytes = 1024;
  limits.max_body_bytes = 100;
  auto status = [&](const std::string& bytes) {
    Framer f(limits);
    f.append(bytes.data(), bytes.size());
    Framer::Status s = f.advance();
    while (s == Framer::Status::kReady) {
      f.take();
      s = f.advance();
    }
    EXPECT_TRUE(s != Framer::Status::kError || !f.error_message().empty());
    return s == Framer::Status::kError ? f.error_status() : 0;
  };
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
  EXPECT_EQ(status(post + "Content-Length: -5\r\n\r\n"), 400);
  EXPECT_EQ(status(post + "Content-Length: abc\r\n\r\n"), 400);
  EXPECT_EQ(status(post + "Content-Length: 5, 5\r\n\r\n"), 400);
  EXPECT_EQ(status(post + "Content-Length: \r\n\r\n"), 400);
  EXPECT_EQ(status(post + "Content-Length: 5\r\nContent-Length: 6\r\n\r\n"), 400);
  EXPECT_EQ(status(post + "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc"), 0);
  EXPECT_EQ(status(post + "Content-Length: 101\r\n\r\n"), 413);  // at once, before the body
  EXPECT_EQ(status(post + "Content-Length: 99999999999999999999999999\r\n\r\n"), 413);
  EXPECT_EQ(status(post + "Content-Length: 0000000000000000000000000003\r\n\r\nabc"), 0);
  EXPECT_EQ(status(post + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"), 400);
  EXPECT_EQ(status(post + "Transfer-Encoding: gzip, chunked\r\n\r\n"), 501);
  EXPECT_EQ(status(post + "Transfer-Encoding: chunked\r\n\r\n65\r\n"), 413);  // 101 bytes announced
  EXPECT_EQ(status(post + "Transfer-Encoding: chunked\r\n\r\n40\r\n" + std::string(64, 'a') + "\r\n40\r\n"), 413);
  EXPECT_EQ(status(post + "Transfer-Encoding: chunked\r\n\r\nzz\r\n"), 400);
  EXPECT_EQ(status(post + "Transfer-Encoding: chunked\r\n\r\n3\r\nabcX"), 400);
  EXPECT_EQ(status(post + "Transfer-Encoding: chunked\r\n\r\nfffffffffffffffffffffffff\r\n"), 413);
  EXPECT_EQ(status(post + "Transfer-Encoding: chunked\r\n\r\n0\r\n" + std::string(2000, 'x')), 431);
  EXPECT_EQ(status(post + "X: " + std::string(2000, 'a')), 431);  // head over the limit, unfinished
  EXPECT_EQ(status(post + " folded\r\n\r\n"), 400);
  EXPECT_EQ(status(post + "Bad Name: 1\r\n\r\n"), 400);
  EXPECT_EQ(status(post + "NoColon\r\n\r\n"), 400);
  EXPECT_EQ(status(post + "Expect: magic\r\n\r\n"), 417);
  EXPECT_EQ(status("GET /\r\n\r\n"), 400);
  EXPECT_EQ(status("GET / HTTP/2.0\r\n\r\n"), 505);
  EXPECT_EQ(status("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
  // What cpp-httplib would cut or refuse unnamed: control bytes in a value (it stops at
  // a NUL: "Bearer KEY\0x" passed as "Bearer KEY"), lines of 8 KiB, two Authorization
  // fields (which one counts?), a trailer line without a colon.
  static const char kNul[] = "Authorization: Bearer k\0x\r\n\r\n";
  EXPECT_EQ(status(post + std::string(kNul, sizeof kNul - 1)), 400);
  EXPECT_EQ(status(post + "X: a\x01b\r\n\r\n"), 400);
  EXPECT_EQ(status(post + "X: a\tb\r\nContent-Length: 0\r\n\r\n"), 0);
  EXPECT_EQ(status(post + "Authorization: Bearer a\r\nauthorization: Bearer b\r\n\r\n"), 400);
  EXPECT_EQ(status(post + "Transfer-Encoding: chunked\r\n\r\n0\r\nnocolon\r\n\r\n"), 400);
  FramingLimits wide;
  wide.max_head_bytes = 64 << 10;
  auto wide_status = [&](const std::string& bytes) {
    Framer f(wide);
    f.append(bytes.data(), bytes.size());
    return f.advance() == Framer::Status::kError ? f.error_status() : 0;
  };
  EXPECT_EQ(wide_status(post + "X: " + std::string(8180, 'a') + "\r\n\r\n"), 0);
  EXPECT_EQ(wide_status(post + "X: " + std::string(8200, 'a') + "\r\n\r\n"), 431);
  EXPECT_EQ(wide_status("GET /" + std::string(8200, 'a') + " HTTP/1.1\r\n\r\n"), 414);
  // An error's message says what was wrong.
  Framer f(limits);
  const std::string bad = post + "Content-Length: -5\r\n\r\n";
  f.append(bad.data(), bad.size());
  ASSERT_EQ(f.advance(), Framer::Status::kError);
  EXPECT_NE(f.error_message().find("Content-Length \"-5\""), std::string::npos) << f.error_message();
}

TEST(ServeFraming, StartedAndHeadDone) {
  Framer f({});
  f.append("\r\n\r\n", 4);
  EXPECT_EQ(f.advance(), Framer::Status::kNeedMore);
  EXPECT_FALSE(f.started());  // blank lines before a request are no request
  f.append("P", 1);
  EXPECT_EQ(f.advance(), Framer::Status::kNeedMore);
  EXPECT_TRUE(f.started());
  EXPECT_FALSE(f.head_done());
  const std::string rest = "OST / HTTP/1.1\r\nContent-Length: 2\r\n\r\na";
  f.append(rest.data(), rest.size());
  EXPECT_EQ(f.advance(), Framer::Status::kNeedMore);
  EXPECT_TRUE(f.head_done());
  EXPECT_FALSE(f.wants_continue());
  f.append("b", 1);
  EXPECT_EQ(f.advance(), Framer::Status::kReady);
}

// --- admission and health --------------------------------------------------------------

TEST(ServeEngine, AdmissionIsDecidedOnce) {
  ServeChannel a;
  EXPECT_EQ(a.wait_admission(std::chrono::milliseconds(1)), ServeChannel::Admission::kPending);
  std::thread engine([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    a.admit(false);
    a.admit(true);  // decided already
  });
  EXPECT_EQ(a.wait_admission(std::chrono::seconds(10)), ServeChannel::Admission::kRefused);
  engine.join();
  EXPECT_EQ(a.wait_admission(std::chrono::milliseconds(0)), ServeChannel::Admission::kRefused);
  ServeChannel b;
  b.admit(true);
  EXPECT_EQ(b.wait_admission(std::chrono::milliseconds(0)), ServeChannel::Admission::kAdmitted);
}

TEST(ServeEngine, HealthReportsAStall) {
  using Clock = std::chrono::steady_clock;
  ServeHealth h(2.0);
  const auto t0 = Clock::now();
  EXPECT_EQ(h.problem(t0 + std::chrono::seconds(100)), "");  // the loop has not started
  h.loop_turned(t0);
  h.peers_heard(1, 0.5, t0);
  EXPECT_EQ(h.problem(t0 + std::chrono::seconds(1)), "");
  const std::string loop = h.problem(t0 + std::chrono::seconds(3));
  EXPECT_NE(loop.find("engine loop"), std::string::npos) << loop;
  h.loop_turned(t0 + std::chrono::seconds(3));
  h.peers_heard(1, 2.5, t0 + std::chrono::seconds(3));
  const std::string beat = h.problem(t0 + std::chrono::seconds(3));
  EXPECT_NE(beat.find("rank 1"), std::string::npos) << beat;
  h.peers_heard(1, 0.1, t0 + std::chrono::seconds(4));
  h.loop_turned(t0 + std::chrono::seconds(4));
  EXPECT_EQ(h.problem(t0 + std::chrono::seconds(4)), "");
  h.peers_heard(-1, 0, t0 + std::chrono::seconds(4));  // one rank: nothing to hear
  EXPECT_EQ(h.problem(t0 + std::chrono::seconds(5)), "");
  ServeHealth off(0.0);
  off.loop_turned(t0);
  EXPECT_EQ(off.problem(t0 + std::chrono::hours(1)), "");
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

// With a stop string, the text held back was cut by bytes: a streamed piece ended inside
// a character of several bytes and the client saw U+FFFD for each half (SmolLM2, Chinese
// text, any stop string). Every piece is whole characters, and the pieces still add up to
// completion_text, for stop strings of 2 to 9 bytes and one that does stop the text.
TEST_F(ServeUnits, StreamedTextWithAStopStringNeverCutsACharacter) {
  Request r;
  r.ids = tok_->encode("Once", true);
  // stories260k has no CJK or emoji pieces: each such character is 3 or 4 byte tokens.
  const std::vector<int32_t> ids =
      tok_->encode("\xe4\xb8\xad\xe6\x96\x87\xef\xbc\x9a\xe5\x8c\x97\xe4\xba\xac is big \xf0\x9f\x98\x80 ok "
                   "\xc3\xa9t\xc3\xa9 \xe4\xb8\x8a\xe6\xb5\xb7",
                   false);
  for (const std::string stop : {"ab", "zzzz", "zzzzzzzzz", "\xf0\x9f\x98\x80 ok"}) {
    r.settings.stop = {stop};
    CompletionStream stream(*tok_, r);
    std::string shown;
    for (int32_t id : ids) {
      const std::string piece = stream.push(id);
      EXPECT_NO_THROW(check_utf8(piece, "piece")) << "stop " << stop << ": a piece cut a character";
      shown += piece;
    }
    const std::string last = stream.finish();
    EXPECT_NO_THROW(check_utf8(last, "last piece"));
    shown += last;
    bool stopped = false;
    EXPECT_EQ(shown, completion_text(*tok_, r, ids, stopped)) << "stop " << stop;
    EXPECT_EQ(stopped, stop == "\xf0\x9f\x98\x80 ok") << stop;
  }
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

// text_offset counts characters (code points), as OpenAI and vLLM do, not UTF-8 bytes,
// and places each token in the returned text: the byte tokens of one character all get
// its position (each used to count one character, so the offsets of Chinese text ran past
// its end), a special token counts nothing. The text here: "Once" echoed, then the
// completion "  caf\u00e9 \u4e2d ok" (stories260k's tokens: "\u2581", "\u2581c", "a", "f",
// "\u00e9", "\u2581", <0xE4>, <0xB8>, <0xAD>, "\u2581o", "k"), 15 characters in all.
TEST_F(ServeUnits, TextOffsetsAreCharacterPositionsInTheText) {
  EXPECT_EQ(utf8_chars("a"), 1u);
  EXPECT_EQ(utf8_chars("\xc3\xa9t\xc3\xa9"), 3u);  // "\u00e9t\u00e9"
  EXPECT_EQ(utf8_chars("\xe6\x97\xa5\xe6\x9c\xac"), 2u);
  const std::vector<int32_t> prompt = tok_->encode("Once", true);
  const std::vector<int32_t> ids = tok_->encode(" caf\xc3\xa9 \xe4\xb8\xad ok", false);
  ASSERT_EQ(prompt.size(), 2u);
  ASSERT_EQ(ids.size(), 11u);
  Request r;
  r.ids = prompt;
  bool stopped = false;
  ASSERT_EQ(utf8_chars("Once" + completion_text(*tok_, r, ids, stopped)), 15u);
  const std::vector<TokenLogprobs> lps(ids.size());
  const std::vector<double> prompt_lps = {-1.0};
  {
    TextOffsets offsets(*tok_, prompt, /*echo=*/true, utf8_chars("Once"));
    const json j = json::parse(dump_json(completion_logprobs(*tok_, prompt, &prompt_lps, nullptr, ids, lps, 0, offsets)));
    EXPECT_EQ(j["text_offset"].get<std::vector<size_t>>(),
              (std::vector<size_t>{0, 0, 4, 5, 7, 8, 9, 10, 11, 11, 11, 12, 14}));
  }
  {  // without echo, from the completion's start; and in two chunks, as a stream sends it
    TextOffsets offsets(*tok_, prompt, /*echo=*/false, 4);
    const std::vector<int32_t> a(ids.begin(), ids.begin() + 7), b(ids.begin() + 7, ids.end());
    const std::vector<TokenLogprobs> la(a.size()), lb(b.size());
    const json ja = json::parse(dump_json(completion_logprobs(*tok_, prompt, nullptr, nullptr, a, la, 0, offsets)));
    const json jb = json::parse(dump_json(completion_logprobs(*tok_, prompt, nullptr, nullptr, b, lb, 0, offsets)));
    EXPECT_EQ(ja["text_offset"].get<std::vector<size_t>>(), (std::vector<size_t>{0, 1, 3, 4, 5, 6, 7}));
    EXPECT_EQ(jb["text_offset"].get<std::vector<size_t>>(), (std::vector<size_t>{7, 7, 8, 10}));
  }
  {  // a text cut short (a stop string "\u4e2d"): no offset past the 7 characters shown
    TextOffsets offsets(*tok_, prompt, /*echo=*/false, 4);
    offsets.cap(7);
    const json j = json::parse(dump_json(completion_logprobs(*tok_, prompt, nullptr, nullptr, ids, lps, 0, offsets)));
    EXPECT_EQ(j["text_offset"].get<std::vector<size_t>>(), (std::vector<size_t>{0, 1, 3, 4, 5, 6, 7, 7, 7, 7, 7}));
  }
}

TEST(ServeEngine, QueueBoundsInFlightChoices) {
  RequestQueue q(3);
  auto ch = std::make_shared<ServeChannel>();
  EXPECT_EQ(q.submit(std::vector<ServeChoice>(2), ch), RequestQueue::Admit::kOk);
  EXPECT_EQ(q.submit(std::vector<ServeChoice>(2), ch), RequestQueue::Admit::kFull);
  EXPECT_EQ(q.submit(std::vector<ServeChoice>(4), ch), RequestQueue::Admit::kTooMany);  // never fits
  EXPECT_EQ(q.take(std::chrono::milliseconds(0)).size(), 1u);
  q.finished(2);
  EXPECT_EQ(q.submit(std::vector<ServeChoice>(3), ch), RequestQueue::Admit::kOk);
  q.close();
  EXPECT_EQ(q.submit(std::vector<ServeChoice>(1), ch), RequestQueue::Admit::kClosed);
}

TEST(ServeEngine, MetricsText) {
  ServeMetrics m;
  m.http_refused("capacity");
  m.http_connections(7);
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
  EXPECT_NE(t.find("linnet_http_connections_open 7\n"), std::string::npos);
  EXPECT_NE(t.find("linnet_http_refused_total{reason=\"capacity\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("linnet_http_refused_total{reason=\"timeout\"} 0\n"), std::string::npos);
}

}  // namespace
}  // namespace linnet
