#include "server/http/http_front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

namespace linnet {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

constexpr double kLingerSeconds = 2.0;  // reading (and dropping) a closing connection's input

// httplib's accept loop enqueues each connection's processing; this queue runs it at
// once on the accept thread, where process_and_close_socket hands the socket over.
class InlineQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  const int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                      : ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ip.clear();
  port = -1;
  if (rc != 0) return;
  char buf[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

// One connection. While it is being answered (kBusy) a handler thread owns it; else the
// reactor does.
struct Conn {
  enum class Phase { kIdle, kHead, kBody, kBusy, kClosing };
  Conn(int f, FramingLimits limits) : fd(f), framer(limits) {}
  int fd;
  RequestFramer framer;
  Phase phase = Phase::kIdle;
  Clock::time_point deadline, since;
  int64_t served = 0;
  bool continue_sent = false, eof = false, in_epoll = false, close_after_out = false;
  std::string out;                              // what the reactor still has to write
  std::optional<RequestFramer::Message> ready;  // framed, waiting for `out` to be written
  std::string remote_ip, local_ip;
  int remote_port = -1, local_port = -1;
};

// The stream httplib's process_request reads one framed request from and writes its
// response to.
class MessageStream final : public httplib::Stream {
 public:
  MessageStream(const Conn& c, std::string message, double write_timeout_s)
      : conn_(c), message_(std::move(message)), write_timeout_(seconds(write_timeout_s)) {}

  bool is_readable() const override { return pos_ < message_.size(); }

  // Writable within the write timeout, and the peer has not closed (a peek sees no EOF):
  // a client that leaves ends its response even while nothing is written.
  bool is_writable() const override {
    pollfd p{conn_.fd, POLLOUT, 0};
    const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(write_timeout_).count());
    int r;
    do {
      r = ::poll(&p, 1, ms);
    } while (r < 0 && errno == EINTR);
    if (r <= 0 || (p.revents & (POLLERR | POLLNVAL))) return false;
    char ch;
    const ssize_t k = ::recv(conn_.fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k > 0) return true;  // the next request, already sent
    if (k == 0) return false;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  }

  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, message_.size() - pos_);
    std::memcpy(ptr, message_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    const auto until = Clock::now() + write_timeout_;
    for (;;) {
      const ssize_t k = ::send(conn_.fd, ptr, size, MSG_NOSIGNAL);
      if (k >= 0) return k;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) return -1;
      pollfd p{conn_.fd, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(left)) < 0 && errno != EINTR) return -1;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = conn_.remote_ip;
    port = conn_.remote_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = conn_.local_ip;
    port = conn_.local_port;
  }
  socket_t socket() const override { return conn_.fd; }

 private:
  const Conn& conn_;
  std::string message_;
  size_t pos_ = 0;
  Clock::duration write_timeout_;
};

// Handler threads: jobs in order; stop() drops the ones not started.
class Pool {
 public:
  void start(size_t n) {
    for (size_t i = 0; i < n; ++i) threads_.emplace_back([this] { run(); });
  }
  void submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

}  // namespace

struct FrontedServer::Front {
  enum class After { kKeep, kLinger, kClose };

  Front(FrontConfig c, FrontedServer& s) : cfg(std::move(c)), server(s) {}

  FrontConfig cfg;
  FrontedServer& server;
  int ep = -1, wake_fd = -1;
  std::thread reactor;
  Pool api, light;
  std::atomic<bool> running{false}, stopping{false}, draining{false};
  std::atomic<int64_t> open{0};
  std::atomic<int64_t> busy{0};  // requests dispatched and not yet answered

  std::mutex mutex;  // incoming, returned
  std::vector<int> incoming;
  std::vector<std::pair<Conn*, After>> returned;

  std::unordered_map<int, std::unique_ptr<Conn>> conns;  // the reactor's (and stop_front's once it ended)

  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
  }

  void refused(const char* reason) {
    if (cfg.on_refused) cfg.on_refused(reason);
  }

  // --- from other threads ---

  void adopt(int fd) {
    if (!running || stopping) {
      ::close(fd);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      incoming.push_back(fd);
    }
    wake();
  }

  void give_back(Conn* c, After after) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      returned.emplace_back(c, after);
    }
    wake();
  }

  // A handler thread answers one framed request.
  void answer(Conn* c, std::string message, bool close) {
    bool closed = false, ok = false;
    {
      MessageStream strm(*c, std::move(message), cfg.write_timeout_s);
      try {
        ok = server.process_request(strm, close, closed, nullptr);
      } catch (...) {
        ok = false;
      }
    }
    ++c->served;  // c is the reactor's again after give_back
    give_back(c, !ok ? After::kClose : (closed || close) ? After::kLinger : After::kKeep);
    --busy;
  }

  // --- the reactor ---

  void watch(Conn& c, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = c.fd;
    if (::epoll_ctl(ep, c.in_epoll ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c.fd, &ev) == 0) c.in_epoll = true;
  }

  void unwatch(Conn& c) {
    if (c.in_epoll) ::epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
    c.in_epoll = false;
  }

  void close_conn(Conn& c) {
    unwatch(c);
    const int fd = c.fd;
    ::close(fd);
    conns.erase(fd);  // c is gone
    --open;
  }

  // Closing: no more requests; the input is read and dropped for a while, so that the
  // peer reads the last response before the close (no reset over unread input).
  void linger(Conn& c, Clock::time_point now) {
    ::shutdown(c.fd, SHUT_WR);
    c.phase = Conn::Phase::kClosing;
    c.deadline = now + seconds(kLingerSeconds);
    c.out.clear();
    watch(c, EPOLLIN);
  }

  // Writes what the reactor has for `c`; false when `c` was closed.
  bool flush(Conn& c, Clock::time_point now) {
    while (!c.out.empty()) {
      const ssize_t k = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        c.out.erase(0, static_cast<size_t>(k));
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        watch(c, EPOLLIN | EPOLLOUT);
        return true;
      }
      close_conn(c);
      return false;
    }
    if (c.close_after_out) {
      c.close_after_out = false;
      linger(c, now);
      return true;
    }
    if (c.phase != Conn::Phase::kClosing) watch(c, EPOLLIN);
    if (c.ready) {
      RequestFramer::Message m = std::move(*c.ready);
      c.ready.reset();
      dispatch(c, std::move(m));
    }
    return true;
  }

  void send_error(Conn& c, int status, const std::string& message, Clock::time_point now) {
    const std::string body = cfg.error_body ? cfg.error_body(status, message) : message;
    c.out = "HTTP/1.1 " + std::to_string(status) + " " + http_reason(status) +
            "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
            "\r\nConnection: close\r\n\r\n" + body;
    c.close_after_out = true;
    c.ready.reset();
    c.phase = Conn::Phase::kClosing;
    c.deadline = now + seconds(kLingerSeconds);
    refused(status == 408 ? "timeout" : status == 413 || status == 431 ? "too_large" : "framing");
    flush(c, now);
  }

  void dispatch(Conn& c, RequestFramer::Message m) {
    if (!c.out.empty()) {  // a 100 Continue is still being written
      c.ready = std::move(m);
      return;
    }
    unwatch(c);
    c.phase = Conn::Phase::kBusy;
    c.continue_sent = false;
    const bool close = m.close || c.eof || c.served + 1 >= cfg.keep_alive_max || draining || stopping;
    Pool& pool = m.method == "POST" ? api : light;
    Conn* conn = &c;
    ++busy;
    pool.submit([this, conn, message = std::move(m.bytes), close]() mutable { answer(conn, std::move(message), close); });
  }

  // Frames what `c` has buffered: dispatches a complete request, answers an error, or
  // moves the deadlines on. False when `c` was closed.
  bool step(Conn& c, Clock::time_point now) {
    const RequestFramer::Status s = c.framer.advance();
    if (s == RequestFramer::Status::kError) {
      const int fd = c.fd;
      send_error(c, c.framer.error_status(), c.framer.error_message(), now);
      return conns.count(fd) > 0;  // c may be gone
    }
    if (s == RequestFramer::Status::kReady) {
      dispatch(c, c.framer.take());
      return true;
    }
    if (c.eof) {  // the peer closed in the middle of a request (or before one)
      close_conn(c);
      return false;
    }
    if (c.framer.head_done()) {
      if (c.phase != Conn::Phase::kBody) {
        c.phase = Conn::Phase::kBody;
        c.deadline = now + seconds(cfg.body_timeout_s);
      }
      if (c.framer.wants_continue() && !c.continue_sent) {
        c.continue_sent = true;
        c.out += "HTTP/1.1 100 Continue\r\n\r\n";
        return flush(c, now);
      }
    } else if (c.framer.started() && c.phase == Conn::Phase::kIdle) {
      c.phase = Conn::Phase::kHead;
      c.deadline = now + seconds(cfg.header_timeout_s);
    }
    return true;
  }

  void on_readable(Conn& c, Clock::time_point now) {
    char buf[16384];
    for (int rounds = 0; rounds < 8; ++rounds) {  // at most 128 KiB per wake-up: fair to the others
      const ssize_t k = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (k > 0) {
        if (c.phase != Conn::Phase::kClosing) c.framer.append(buf, static_cast<size_t>(k));
        if (static_cast<size_t>(k) < sizeof buf) break;
        continue;
      }
      if (k == 0) {
        c.eof = true;
        break;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close_conn(c);
      return;
    }
    if (c.phase == Conn::Phase::kClosing) {
      if (c.eof) close_conn(c);
      return;
    }
    if (c.phase == Conn::Phase::kBusy) return;
    step(c, now);
  }

  // Room for one more connection: closes the one idle longest (lingering ones first).
  bool evict_one() {
    Conn* best = nullptr;
    for (auto& [fd, cp] : conns) {
      Conn& c = *cp;
      if (c.phase != Conn::Phase::kIdle && c.phase != Conn::Phase::kClosing) continue;
      if (!best || (c.phase == Conn::Phase::kClosing && best->phase != Conn::Phase::kClosing) ||
          (c.phase == best->phase && c.since < best->since)) {
        best = &c;
      }
    }
    if (!best) return false;
    close_conn(*best);
    return true;
  }

  void take_incoming(Clock::time_point now) {
    std::vector<int> fds;
    {
      std::lock_guard<std::mutex> lock(mutex);
      fds.swap(incoming);
    }
    for (int fd : fds) {
      const int flags = ::fcntl(fd, F_GETFL, 0);
      ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
      if (stopping) {
        ::close(fd);
        continue;
      }
      if (open >= cfg.max_open && !evict_one()) {
        // Every connection is in the middle of a request: refuse this one now.
        const std::string body = cfg.error_body ? cfg.error_body(503, "too many open connections; retry later")
                                                : std::string("too many open connections");
        const std::string msg = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + body;
        [[maybe_unused]] const ssize_t n = ::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        ::shutdown(fd, SHUT_WR);
        ::close(fd);
        refused("capacity");
        continue;
      }
      int yes = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
      auto c = std::make_unique<Conn>(fd, cfg.framing);
      address_of(fd, true, c->remote_ip, c->remote_port);
      address_of(fd, false, c->local_ip, c->local_port);
      c->since = now;
      c->deadline = now + seconds(cfg.keep_alive_timeout_s);
      Conn& ref = *c;
      conns[fd] = std::move(c);
      ++open;
      watch(ref, EPOLLIN);
    }
  }

  void take_returned(Clock::time_point now) {
    std::vector<std::pair<Conn*, After>> back;
    {
      std::lock_guard<std::mutex> lock(mutex);
      back.swap(returned);
    }
    for (auto& [c, after] : back) {
      if (after == After::kClose) {
        close_conn(*c);
      } else if (after == After::kLinger) {
        linger(*c, now);
      } else {
        c->phase = Conn::Phase::kIdle;
        c->since = now;
        c->deadline = now + seconds(cfg.keep_alive_timeout_s);
        watch(*c, EPOLLIN);
        step(*c, now);  // the next request may be buffered already (pipelining)
      }
    }
  }

  void check_deadlines(Clock::time_point now) {
    std::vector<int> due;
    for (auto& [fd, c] : conns) {
      if (c->phase != Conn::Phase::kBusy && now >= c->deadline) due.push_back(fd);
    }
    for (int fd : due) {
      const auto it = conns.find(fd);
      if (it == conns.end()) continue;
      Conn& c = *it->second;
      if (c.phase == Conn::Phase::kHead || c.phase == Conn::Phase::kBody) {
        const bool head = c.phase == Conn::Phase::kHead;
        const double s = head ? cfg.header_timeout_s : cfg.body_timeout_s;
        char secs[32];
        std::snprintf(secs, sizeof secs, "%g", s);
        send_error(c, 408,
                   std::string(head ? "the request's header fields did not arrive within "
                                    : "the request body did not arrive within ") +
                       secs + " s",
                   now);
      } else {
        close_conn(c);  // idle past the keep-alive timeout, or done lingering
      }
    }
  }

  void run() {
    std::vector<epoll_event> events(256);
    auto last_check = Clock::now();
    while (!stopping) {
      const int n = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), 50);
      const auto now = Clock::now();
      // Answered connections first: one whose response is out is idle again, so a new
      // connection at --max-open-connections can take its place instead of a 503.
      take_returned(now);
      take_incoming(now);
      for (int i = 0; i < n; ++i) {
        const int fd = events[static_cast<size_t>(i)].data.fd;
        if (fd == wake_fd) {
          uint64_t v;
          [[maybe_unused]] const ssize_t r = ::read(wake_fd, &v, sizeof v);
          continue;
        }
        const auto it = conns.find(fd);
        if (it == conns.end()) continue;
        Conn& c = *it->second;
        if (c.phase == Conn::Phase::kBusy) continue;
        const uint32_t e = events[static_cast<size_t>(i)].events;
        if ((e & EPOLLOUT) && !c.out.empty() && !flush(c, now)) continue;
        if (e & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(c, now);
      }
      if (now - last_check >= std::chrono::milliseconds(50)) {
        check_deadlines(now);
        last_check = now;
      }
    }
  }
};

FrontedServer::FrontedServer(FrontConfig config) : front_(std::make_unique<Front>(std::move(config), *this)) {
  new_task_queue = [] { return new InlineQueue(); };
  // The Keep-Alive header httplib writes says what the front does.
  set_keep_alive_timeout(static_cast<time_t>(std::max(1.0, front_->cfg.keep_alive_timeout_s)));
  set_keep_alive_max_count(static_cast<size_t>(std::max<int64_t>(1, front_->cfg.keep_alive_max)));
}

FrontedServer::~FrontedServer() { stop_front(); }

void FrontedServer::start_front() {
  Front& f = *front_;
  if (f.running) return;
  f.ep = ::epoll_create1(EPOLL_CLOEXEC);
  f.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = f.wake_fd;
  ::epoll_ctl(f.ep, EPOLL_CTL_ADD, f.wake_fd, &ev);
  f.api.start(static_cast<size_t>(std::max<int64_t>(1, f.cfg.api_threads)));
  f.light.start(static_cast<size_t>(std::max<int64_t>(1, f.cfg.light_threads)));
  f.running = true;
  f.reactor = std::thread([&f] { f.run(); });
}

void FrontedServer::drain_front() { front_->draining = true; }

void FrontedServer::stop_front(std::chrono::milliseconds grace) {
  Front& f = *front_;
  if (!f.running) return;
  // The requests being answered, or framed meanwhile, are answered first (for up to
  // `grace`); every response says Connection: close.
  f.draining = true;
  const auto start = Clock::now(), until = start + grace;
  const auto settle = start + std::min<Clock::duration>(grace, std::chrono::milliseconds(50));  // requests on their way
  while ((f.busy > 0 || Clock::now() < settle) && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  f.stopping = true;
  f.wake();
  if (f.reactor.joinable()) f.reactor.join();
  // Answers in progress end (httplib stops chunked responses once stop() was called, and
  // every write has its timeout); the ones not started are dropped.
  f.api.stop();
  f.light.stop();
  for (int fd : f.incoming) ::close(fd);
  f.incoming.clear();
  f.returned.clear();
  for (auto& [fd, c] : f.conns) ::close(fd);
  f.conns.clear();
  f.open = 0;
  ::close(f.ep);
  ::close(f.wake_fd);
  f.running = false;
}

int64_t FrontedServer::open_connections() const { return front_->open; }

bool FrontedServer::process_and_close_socket(socket_t sock) {
  front_->adopt(sock);
  return true;
}

}  // namespace linnet
