#include "driver/serve_wire.h"

#include <cstring>

#include "common/error.h"

namespace linnet::wire {
namespace {

class Writer {
 public:
  template <class T>
  void pod(const T& v) {
    const char* p = reinterpret_cast<const char*>(&v);
    bytes.append(p, sizeof(T));
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    pod<uint64_t>(v.size());
    const char* p = reinterpret_cast<const char*>(v.data());
    bytes.append(p, v.size() * sizeof(T));
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes += s;
  }
  std::string bytes;
};

class Reader {
 public:
  explicit Reader(const std::string& b) : b_(b) {}
  template <class T>
  T pod() {
    LINNET_CHECK(at_ + sizeof(T) <= b_.size(), "serve message truncated");
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> vec() {
    const uint64_t n = pod<uint64_t>();
    LINNET_CHECK(n <= (b_.size() - at_) / sizeof(T), "serve message truncated");
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), b_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
    return v;
  }
  std::string str() {
    const uint64_t n = pod<uint64_t>();
    LINNET_CHECK(n <= b_.size() - at_, "serve message truncated");
    std::string s = b_.substr(at_, n);
    at_ += n;
    return s;
  }

 private:
  const std::string& b_;
  size_t at_ = 0;
};

void write_add(Writer& w, const Add& a, bool with_stop) {
  w.pod(a.id);
  w.pod(a.after);
  w.pod<uint8_t>(a.score_prompt);
  const BatchRequest& r = a.request;
  w.vec(r.prompt);
  const SamplingParams& s = r.sampling;
  for (double d : {s.temperature, s.top_p, s.min_p, s.repetition_penalty, s.presence_penalty, s.frequency_penalty}) {
    w.pod(d);
  }
  w.pod(s.top_k);
  w.pod(s.seed);
  w.pod(s.vocab_limit);
  w.pod(r.max_new_tokens);
  w.vec(r.eos_ids);
  w.pod(r.top_logprobs);
  if (with_stop) {
    w.pod<uint64_t>(a.stop.size());
    for (const auto& t : a.stop) w.str(t);
  }
}

Add read_add(Reader& r, bool with_stop) {
  Add a;
  a.id = r.pod<int64_t>();
  a.after = r.pod<int64_t>();
  a.score_prompt = r.pod<uint8_t>() != 0;
  BatchRequest& q = a.request;
  q.prompt = r.vec<int32_t>();
  SamplingParams& s = q.sampling;
  for (double* d : {&s.temperature, &s.top_p, &s.min_p, &s.repetition_penalty, &s.presence_penalty,
                    &s.frequency_penalty}) {
    *d = r.pod<double>();
  }
  s.top_k = r.pod<int64_t>();
  s.seed = r.pod<uint64_t>();
  s.vocab_limit = r.pod<int64_t>();
  q.max_new_tokens = r.pod<int64_t>();
  q.eos_ids = r.vec<int64_t>();
  q.top_logprobs = r.pod<int64_t>();
  if (with_stop) {
    const uint64_t n = r.pod<uint64_t>();
    for (uint64_t i = 0; i < n; ++i) a.stop.push_back(r.str());
  }
  return a;
}

}  // namespace

std::string encode(const Plan& plan, bool with_stop) {
  Writer w;
  w.pod<uint64_t>(plan.adds.size());
  for (const Add& a : plan.adds) write_add(w, a, with_stop);
  w.vec(plan.cancels);
  w.pod<uint8_t>(plan.shutdown);
  return std::move(w.bytes);
}

Plan decode(const std::string& bytes, bool with_stop) {
  Reader r(bytes);
  Plan plan;
  const uint64_t n = r.pod<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) plan.adds.push_back(read_add(r, with_stop));
  plan.cancels = r.vec<int64_t>();
  plan.shutdown = r.pod<uint8_t>() != 0;
  return plan;
}



std::string encode(const Report& rep) {
  Writer w;
  w.pod<uint64_t>(rep.events.size());
  for (const WireEvent& we : rep.events) {
    const ServeEvent& e = we.event;
    w.pod(we.id);
    w.pod<int32_t>(static_cast<int32_t>(e.kind));
    w.pod(e.token);
    w.pod<uint8_t>(e.logprobs.has_value());
    if (e.logprobs) {
      w.pod(e.logprobs->logprob);
      std::vector<int32_t> ids;
      std::vector<float> lps;
      for (const auto& [i, l] : e.logprobs->top) {
        ids.push_back(i);
        lps.push_back(l);
      }
      w.vec(ids);
      w.vec(lps);
    }
    w.vec(e.prompt_logprobs);
    w.pod<uint64_t>(e.prompt_top.size());
    for (const auto& top : e.prompt_top) {
      std::vector<int32_t> ids;
      std::vector<float> lps;
      for (const auto& [i, l] : top) {
        ids.push_back(i);
        lps.push_back(l);
      }
      w.vec(ids);
      w.vec(lps);
    }
    w.str(e.text);
    w.pod<uint8_t>(e.stopped);
    w.str(e.finish_reason);
    w.str(e.error);
  }
  w.vec(rep.steps);
  for (int64_t v : {rep.running, rep.waiting, rep.pages_in_use, rep.pages_total, rep.prefix_hit_tokens,
                    rep.spec_steps, rep.spec_proposed, rep.spec_accepted}) {
    w.pod(v);
  }
  w.pod<uint8_t>(rep.bye);
  return std::move(w.bytes);
}

Report decode_report(const std::string& bytes) {
  Reader r(bytes);
  Report rep;
  const uint64_t n = r.pod<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) {
    WireEvent we;
    we.id = r.pod<int64_t>();
    ServeEvent& e = we.event;
    e.kind = static_cast<ServeEvent::Kind>(r.pod<int32_t>());
    e.token = r.pod<int32_t>();
    if (r.pod<uint8_t>()) {
      TokenLogprobs lp;
      lp.logprob = r.pod<float>();
      const std::vector<int32_t> ids = r.vec<int32_t>();
      const std::vector<float> lps = r.vec<float>();
      for (size_t k = 0; k < ids.size() && k < lps.size(); ++k) lp.top.emplace_back(ids[k], lps[k]);
      e.logprobs = std::move(lp);
    }
    e.prompt_logprobs = r.vec<double>();
    const uint64_t tops = r.pod<uint64_t>();
    for (uint64_t p = 0; p < tops; ++p) {
      const std::vector<int32_t> ids = r.vec<int32_t>();
      const std::vector<float> lps = r.vec<float>();
      auto& top = e.prompt_top.emplace_back();
      for (size_t k = 0; k < ids.size() && k < lps.size(); ++k) top.emplace_back(ids[k], lps[k]);
    }
    e.text = r.str();
    e.stopped = r.pod<uint8_t>() != 0;
    e.finish_reason = r.str();
    e.error = r.str();
    rep.events.push_back(std::move(we));
  }
  rep.steps = r.vec<int64_t>();
  for (int64_t* v : {&rep.running, &rep.waiting, &rep.pages_in_use, &rep.pages_total, &rep.prefix_hit_tokens,
                     &rep.spec_steps, &rep.spec_proposed, &rep.spec_accepted}) {
    *v = r.pod<int64_t>();
  }
  rep.bye = r.pod<uint8_t>() != 0;
  return rep;
}

}  // namespace linnet::wire
