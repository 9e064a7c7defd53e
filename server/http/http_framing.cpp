#include "server/http/http_framing.h"

#include <algorithm>
#include <string_view>
#include <vector>

namespace linnet {
namespace {

constexpr size_t kMaxChunkSizeLine = 4096;
// cpp-httplib's CPPHTTPLIB_HEADER_MAX_LENGTH and CPPHTTPLIB_REQUEST_URI_MAX_LENGTH (8192): a
// request line or field line it reads, CRLF included, must be shorter.
constexpr size_t kMaxLineBytes = 8192;

bool is_tchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool ci_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_list(std::string_view s) {
  std::vector<std::string_view> out;
  while (!s.empty()) {
    const size_t comma = s.find(',');
    const std::string_view item = trim_ows(s.substr(0, comma));
    if (!item.empty()) out.push_back(item);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

// A value for a message: quoted, cut to 40 bytes, control bytes as '?'.
std::string quoted(std::string_view v) {
  std::string s = "\"";
  for (size_t i = 0; i < v.size() && i < 40; ++i) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    s += c < 0x20 || c == 0x7f || c == '"' ? '?' : static_cast<char>(c);
  }
  return s + (v.size() > 40 ? "...\"" : "\"");
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

const char* http_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

RequestFramer::Status RequestFramer::fail(int status, std::string message) {
  status_ = Status::kError;
  error_status_ = status;
  error_message_ = std::move(message);
  return status_;
}

void RequestFramer::compact() {
  if (pos_ == 0) return;
  in_.erase(0, pos_);
  scan_ = scan_ >= pos_ ? scan_ - pos_ : 0;
  head_start_ = head_start_ >= pos_ ? head_start_ - pos_ : 0;
  pos_ = 0;
}

void RequestFramer::reset_request() {
  phase_ = Phase::kHead;
  status_ = Status::kNeedMore;
  started_ = false;
  method_.clear();
  head_out_.clear();
  close_ = expect_continue_ = pass_body_ = false;
  length_ = chunk_left_ = decoded_ = 0;
  trailer_bytes_ = 0;
  body_ = std::string();
  compact();
  scan_ = head_start_ = 0;
}

RequestFramer::Status RequestFramer::advance() {
  if (status_ != Status::kNeedMore) return status_;
  if (phase_ == Phase::kHead) {
    if (!started_) {
      // Blank lines before a request line are ignored (RFC 9112 2.2).
      while (pos_ < in_.size() && (in_[pos_] == '\r' || in_[pos_] == '\n')) ++pos_;
      if (pos_ == in_.size()) {
        compact();
        return status_;
      }
      started_ = true;
      head_start_ = scan_ = pos_;
    }
    // The head ends with an empty line: "\n\n" or "\n\r\n".
    size_t end = std::string::npos;
    size_t i = scan_;
    for (; i < in_.size(); ++i) {
      if (in_[i] != '\n') continue;
      if (i + 1 >= in_.size()) break;
      if (in_[i + 1] == '\n') {
        end = i + 2;
        break;
      }
      if (in_[i + 1] == '\r') {
        if (i + 2 >= in_.size()) break;
        if (in_[i + 2] == '\n') {
          end = i + 3;
          break;
        }
      }
    }
    const size_t head_bytes = (end == std::string::npos ? in_.size() : end) - head_start_;
    if (head_bytes > limits_.max_head_bytes) {
      return fail(431, "the request line and header fields are larger than " +
                           std::to_string(limits_.max_head_bytes) + " bytes");
    }
    if (end == std::string::npos) {
      scan_ = i;
      return status_;
    }
    if (parse_head(end) == Status::kError) return status_;
  }
  return advance_body();
}

RequestFramer::Status RequestFramer::parse_head(size_t end) {
  const std::string_view head(in_.data() + head_start_, end - head_start_);
  std::vector<std::string_view> lines;
  for (size_t a = 0; a < head.size();) {
    size_t nl = head.find('\n', a);
    if (nl == std::string_view::npos) nl = head.size();
    std::string_view line = head.substr(a, nl - a);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    a = nl + 1;
  }
  // The request line: method SP target SP version.
  const std::string_view rl = lines.empty() ? std::string_view() : lines[0];
  const size_t sp1 = rl.find(' '), sp2 = rl.rfind(' ');
  if (sp1 == std::string_view::npos || sp1 == sp2) return fail(400, "malformed request line " + quoted(rl));
  const std::string_view method = rl.substr(0, sp1), version = rl.substr(sp2 + 1);
  const std::string_view target = trim_ows(rl.substr(sp1 + 1, sp2 - sp1 - 1));
  if (method.empty() || target.empty() || !std::all_of(method.begin(), method.end(), is_tchar)) {
    return fail(400, "malformed request line " + quoted(rl));
  }
  // cpp-httplib reads at most CPPHTTPLIB_REQUEST_URI_MAX_LENGTH / _HEADER_MAX_LENGTH
  // (8192) bytes of a target or a field line; longer ones are refused here, by name.
  if (target.size() >= kMaxLineBytes) {
    return fail(414, "the request target is longer than " + std::to_string(kMaxLineBytes - 1) + " bytes");
  }
  // The absolute form (RFC 9112 3.2.2) is taken as its path.
  std::string_view path = target;
  for (const std::string_view scheme : {std::string_view("http://"), std::string_view("https://")}) {
    if (path.size() > scheme.size() && ci_equal(path.substr(0, scheme.size()), scheme)) {
      const size_t slash = path.find('/', scheme.size());
      path = slash == std::string_view::npos ? std::string_view("/") : path.substr(slash);
      break;
    }
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    if (version.rfind("HTTP/", 0) == 0) return fail(505, "HTTP version " + quoted(version) + " is not supported");
    return fail(400, "malformed request line " + quoted(rl));
  }
  method_ = std::string(method);
  std::string fields;
  bool has_length = false, has_te = false, has_authorization = false;
  std::string length_text, te;
  for (size_t k = 1; k < lines.size(); ++k) {
    const std::string_view line = lines[k];
    if (line.empty()) break;
    if (line[0] == ' ' || line[0] == '\t') return fail(400, "obsolete line folding in the header fields");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return fail(400, "malformed header field " + quoted(line));
    const std::string_view name = line.substr(0, colon);
    if (!std::all_of(name.begin(), name.end(), is_tchar)) return fail(400, "malformed header field name " + quoted(name));
    const std::string_view value = trim_ows(line.substr(colon + 1));
    if (line.size() + 2 >= kMaxLineBytes) {
      return fail(431, "the header field " + quoted(name) + " is longer than " + std::to_string(kMaxLineBytes - 3) +
                           " bytes");
    }
    // RFC 9110 5.5: no control bytes but HTAB in a field value (httplib would cut at NUL).
    if (std::any_of(value.begin(), value.end(),
                    [](char c) { return (static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f; })) {
      return fail(400, "the header field " + quoted(name) + " holds a control byte");
    }
    if (ci_equal(name, "authorization")) {
      if (has_authorization) return fail(400, "more than one Authorization header field");
      has_authorization = true;
    }
    if (ci_equal(name, "content-length")) {
      if (value.empty() || !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return fail(400, "invalid Content-Length " + quoted(value) + " (expected a number of bytes)");
      }
      if (has_length && value != length_text) return fail(400, "conflicting Content-Length header fields");
      has_length = true;
      length_text = std::string(value);
    } else if (ci_equal(name, "transfer-encoding")) {
      if (has_te) te += ",";
      te += std::string(value);
      has_te = true;
    } else if (ci_equal(name, "expect")) {
      if (!ci_equal(value, "100-continue")) return fail(417, "unsupported expectation " + quoted(value));
      expect_continue_ = true;
    } else if (ci_equal(name, "connection")) {
      for (std::string_view token : split_list(value)) {
        if (ci_equal(token, "close")) close_ = true;
      }
    } else if (ci_equal(name, "range") || ci_equal(name, "if-range") || ci_equal(name, "keep-alive")) {
      // Range: the API's responses are always whole (200, never 206 or 416).
    } else {
      fields.append(name);
      fields += ": ";
      fields.append(value);
      fields += "\r\n";
    }
  }
  if (version == "HTTP/1.0") close_ = true;  // no keep-alive (chunked responses are HTTP/1.1)
  pass_body_ = method_ == "POST" || method_ == "PUT" || method_ == "PATCH" || method_ == "DELETE";
  const std::string too_large = "the request body is larger than " + std::to_string(limits_.max_body_bytes) + " bytes";
  if (has_te) {
    if (has_length) return fail(400, "both Content-Length and Transfer-Encoding in a request");
    if (version == "HTTP/1.0") return fail(400, "Transfer-Encoding in an HTTP/1.0 request");
    const std::vector<std::string_view> codings = split_list(te);
    if (codings.size() != 1 || !ci_equal(codings[0], "chunked")) {
      return fail(501, "Transfer-Encoding " + quoted(te) + " is not supported (only chunked)");
    }
    phase_ = Phase::kChunkSize;
  } else {
    length_ = 0;
    if (has_length) {
      // Leading zeros aside, more than 18 digits is more than any limit here.
      const size_t nz = std::min(length_text.find_first_not_of('0'), length_text.size());
      if (length_text.size() - nz > 18) return fail(413, too_large);
      length_ = std::stoll(length_text);
      if (length_ > limits_.max_body_bytes) return fail(413, too_large);
    }
    phase_ = Phase::kLengthBody;
  }
  head_out_ = method_ + " " + std::string(path) + " " + std::string(version) + "\r\n" + fields;
  pos_ = end;
  return status_;
}

RequestFramer::Status RequestFramer::advance_body() {
  auto need_more = [&] {
    if (pos_ > (size_t{64} << 10) && pos_ * 2 > in_.size()) compact();
    return status_;
  };
  for (;;) {
    const size_t avail = in_.size() - pos_;
    switch (phase_) {
      case Phase::kHead:
        return status_;
      case Phase::kLengthBody: {
        const size_t take = static_cast<size_t>(std::min<int64_t>(length_, static_cast<int64_t>(avail)));
        if (pass_body_) body_.append(in_, pos_, take);
        pos_ += take;
        length_ -= static_cast<int64_t>(take);
        if (length_ > 0) return need_more();
        return status_ = Status::kReady;
      }
      case Phase::kChunkSize: {
        const size_t nl = in_.find('\n', pos_);
        if (nl == std::string::npos) {
          if (avail > kMaxChunkSizeLine) return fail(400, "a chunk size line is too long");
          return need_more();
        }
        std::string_view line(in_.data() + pos_, nl - pos_);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.size() > kMaxChunkSizeLine) return fail(400, "a chunk size line is too long");
        size_t k = 0;
        uint64_t size = 0;
        for (; k < line.size() && hex_value(line[k]) >= 0; ++k) {
          if (size <= (uint64_t{1} << 40)) size = size * 16 + static_cast<uint64_t>(hex_value(line[k]));
        }
        if (k == 0) return fail(400, "invalid chunk size " + quoted(line));
        while (k < line.size() && (line[k] == ' ' || line[k] == '\t')) ++k;
        if (k < line.size() && line[k] != ';') return fail(400, "invalid chunk size " + quoted(line));
        pos_ = nl + 1;
        if (size == 0) {
          phase_ = Phase::kTrailer;
          break;
        }
        if (size > static_cast<uint64_t>(limits_.max_body_bytes - decoded_)) {
          return fail(413, "the request body is larger than " + std::to_string(limits_.max_body_bytes) + " bytes");
        }
        decoded_ += static_cast<int64_t>(size);
        chunk_left_ = static_cast<int64_t>(size);
        phase_ = Phase::kChunkData;
        break;
      }
      case Phase::kChunkData: {
        const size_t take = static_cast<size_t>(std::min<int64_t>(chunk_left_, static_cast<int64_t>(avail)));
        if (pass_body_) body_.append(in_, pos_, take);
        pos_ += take;
        chunk_left_ -= static_cast<int64_t>(take);
        if (chunk_left_ > 0) return need_more();
        phase_ = Phase::kChunkDataEnd;
        break;
      }
      case Phase::kChunkDataEnd: {
        if (avail == 0) return need_more();
        if (in_[pos_] == '\n') {
          pos_ += 1;
        } else if (in_[pos_] == '\r') {
          if (avail < 2) return need_more();
          if (in_[pos_ + 1] != '\n') return fail(400, "chunk data not followed by CRLF");
          pos_ += 2;
        } else {
          return fail(400, "chunk data not followed by CRLF");
        }
        phase_ = Phase::kChunkSize;
        break;
      }
      case Phase::kTrailer: {
        // Trailer fields (RFC 9112 7.1.2) are read and ignored.
        const size_t nl = in_.find('\n', pos_);
        if (nl == std::string::npos) {
          if (trailer_bytes_ + avail > limits_.max_head_bytes) return fail(431, "the trailer section is too large");
          return need_more();
        }
        std::string_view line(in_.data() + pos_, nl - pos_);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        trailer_bytes_ += nl - pos_ + 1;
        pos_ = nl + 1;
        if (trailer_bytes_ > limits_.max_head_bytes) return fail(431, "the trailer section is too large");
        if (line.empty()) return status_ = Status::kReady;
        if (const size_t colon = line.find(':'); colon == std::string_view::npos || colon == 0) {
          return fail(400, "malformed trailer field " + quoted(line));
        }
        break;
      }
    }
  }
}

RequestFramer::Message RequestFramer::take() {
  Message m;
  m.method = method_;
  m.close = close_;
  m.bytes = head_out_;
  if (pass_body_) m.bytes += "Content-Length: " + std::to_string(body_.size()) + "\r\n";
  if (close_) m.bytes += "Connection: close\r\n";
  m.bytes += "\r\n";
  if (pass_body_) m.bytes += body_;
  reset_request();
  return m;
}

}  // namespace linnet
