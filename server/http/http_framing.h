// RequestFramer: the framing of HTTP/1.1 requests (RFC 9112) that `serve` does itself,
// ahead of cpp-httplib, on the bytes of one connection as they arrive.
//
// Why not httplib's own: Debian's httplib 0.11 reads each request with a fresh read-ahead
// buffer (a pipelined second request in it is lost), skips a body it refuses byte by byte
// (Content-Length: -5 reads as 2^64 - 5 and waits for the socket timeout), rejects
// chunked trailers, answers Range with 206, and holds a thread per connection while it
// waits for bytes. The framer finds where each request ends (head, then a body by
// Content-Length or chunked), refuses bad framing with a status of its own, and hands
// httplib one canonical message at a time: the request line and fields without
// Content-Length / Transfer-Encoding / Expect / Range / If-Range / Connection, then
// "Content-Length: N" and the decoded body (for the methods whose body httplib reads),
// "Connection: close" when the connection ends after it. Bytes after a request stay for
// the next one, so pipelined requests are answered in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace linnet {

/// Limits of RequestFramer.
struct FramingLimits {
  size_t max_head_bytes = 64 << 10;  // request line and fields (431 above); also the trailer section
  int64_t max_body_bytes = 8 << 20;  // the body after chunked decoding (413 above)
};

/// Incremental framing of the requests of one connection (see the file header). Not
/// thread-safe; one per connection.
class RequestFramer {
 public:
  enum class Status { kNeedMore, kReady, kError };

  /// One request as httplib gets it.
  struct Message {
    std::string bytes;   // canonical head, then the body (when the method has one httplib reads)
    std::string method;  // e.g. "POST"
    bool close = false;  // the connection ends after this request (Connection: close, HTTP/1.0)
  };

  explicit RequestFramer(FramingLimits limits) : limits_(limits) {}

  /// Adds bytes read from the connection.
  void append(const char* data, size_t n) { in_.append(data, n); }
  /// Frames as far as the bytes go. kReady: take() the request; kError: error_status()
  /// and error_message() say why (the connection must be closed after answering it).
  Status advance();
  /// The request framed by the last advance() (kReady); the framer moves on to the next
  /// request (whose bytes may already be buffered: call advance() again).
  Message take();

  /// A byte of the current request (not a blank line before it) has come.
  bool started() const { return started_; }
  /// The current request's head is complete; its body is being read.
  bool head_done() const { return phase_ != Phase::kHead; }
  /// The head asked "Expect: 100-continue" and the body has not all come.
  bool wants_continue() const { return expect_continue_ && phase_ != Phase::kHead && status_ == Status::kNeedMore; }
  /// Bytes held (of the current request and any after it).
  size_t buffered() const { return in_.size() - pos_; }

  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

 private:
  enum class Phase { kHead, kLengthBody, kChunkSize, kChunkData, kChunkDataEnd, kTrailer };
  Status fail(int status, std::string message);
  Status parse_head(size_t end);
  Status advance_body();
  void reset_request();
  void compact();

  FramingLimits limits_;
  std::string in_;
  size_t pos_ = 0;   // first byte not yet consumed
  size_t scan_ = 0;  // head: where the search for its end resumes
  size_t head_start_ = 0;
  Phase phase_ = Phase::kHead;
  Status status_ = Status::kNeedMore;
  bool started_ = false;
  // The current request.
  std::string method_, head_out_;
  bool close_ = false, expect_continue_ = false, pass_body_ = false;
  int64_t length_ = 0;       // Content-Length body: bytes still to come
  int64_t chunk_left_ = 0;   // chunked: bytes left of the current chunk
  int64_t decoded_ = 0;      // chunked: body bytes announced so far
  size_t trailer_bytes_ = 0;
  std::string body_;
  int error_status_ = 0;
  std::string error_message_;
};

/// The reason phrase of an HTTP status ("Bad Request"); "Error" for one not listed.
const char* http_reason(int status);

}  // namespace linnet
