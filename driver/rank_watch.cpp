#include "driver/rank_watch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <cstring>
#include <sstream>

#include "common/log.h"

namespace linnet {
namespace {

constexpr char kBye = 'B';
constexpr size_t kHelloBytes = 12;  // int32 world rank, uint64 this job's token

// This host's IPv4 addresses, loopback left out.
std::vector<std::string> ipv4_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (!::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) continue;
    if (std::strncmp(text, "127.", 4) == 0) continue;
    out.emplace_back(text);
  }
  ::freeifaddrs(list);
  return out;
}

// A connected socket to address:port within `seconds`, or -1.
int connect_within(const std::string& address, int port, double seconds) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  int err = 0;
  socklen_t len = sizeof err;
  if (::poll(&p, 1, static_cast<int>(seconds * 1000)) != 1 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 ||
      err != 0) {
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void send_byte(int fd, char c) {
  const ssize_t n = ::send(fd, &c, 1, MSG_NOSIGNAL);
  (void)n;
}

}  // namespace

RankWatch::RankWatch(MPI_Comm world, OnDeath on_death, double connect_seconds) : on_death_(std::move(on_death)) {
  int size = 1;
  MPI_Comm_rank(world, &rank_);
  MPI_Comm_size(world, &size);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::vector<char> hosts(static_cast<size_t>(size) * sizeof host);
  MPI_Allgather(host, sizeof host, MPI_CHAR, hosts.data(), sizeof host, MPI_CHAR, world);
  int pid = static_cast<int>(::getpid());
  std::vector<int> pids(static_cast<size_t>(size));
  MPI_Allgather(&pid, 1, MPI_INT, pids.data(), 1, MPI_INT, world);
  for (int r = 0; r < size; ++r) {
    const std::string h(hosts.data() + static_cast<size_t>(r) * sizeof host);
    names_.push_back("rank " + std::to_string(r) + " (pid " + std::to_string(pids[static_cast<size_t>(r)]) + " on " +
                     h + ")");
  }
  if (size == 1) return;

  // A token only this job's ranks know (sent by MPI), so that nothing else that reaches
  // the port can pose as a rank and then "die".
  if (rank_ == 0) {
    std::random_device rd;
    token_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  MPI_Bcast(&token_, 1, MPI_UINT64_T, 0, world);
  // Rank 0 listens and tells where: "port addr addr ...".
  std::string where;
  if (rank_ == 0) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof sa;
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0 ||
        ::listen(listen_fd_, size) != 0 || ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      warn_once(std::string("serve: cannot listen for the other ranks' liveness connections (") + std::strerror(errno) +
                "); a rank that dies is then seen only by --comm-timeout");
      if (listen_fd_ >= 0) ::close(listen_fd_);
      listen_fd_ = -1;
      where = "0";
    } else {
      where = std::to_string(ntohs(sa.sin_port));
      for (const std::string& a : ipv4_addresses()) where += " " + a;
      expected_ = size - 1;
    }
  }
  int bytes = static_cast<int>(where.size());
  MPI_Bcast(&bytes, 1, MPI_INT, 0, world);
  where.resize(static_cast<size_t>(bytes));
  MPI_Bcast(where.data(), bytes, MPI_CHAR, 0, world);

  if (rank_ != 0) {
    std::istringstream in(where);
    int port = 0;
    in >> port;
    std::vector<std::string> addresses;
    // On rank 0's host: the loopback address first.
    if (std::strcmp(host, hosts.data()) == 0) addresses.emplace_back("127.0.0.1");
    for (std::string a; in >> a;) addresses.push_back(a);
    int fd = -1;
    for (size_t i = 0; port > 0 && fd < 0 && i < addresses.size(); ++i) {
      fd = connect_within(addresses[i], port, connect_seconds);
    }
    if (fd < 0) {
      warn_once("serve: " + names_[static_cast<size_t>(rank_)] + " cannot reach rank 0 for its liveness connection" +
                (port > 0 ? " (port " + std::to_string(port) + ")" : std::string()) +
                "; its death is then seen only by --comm-timeout");
    } else {
      char hello[kHelloBytes];  // which rank this is, and the job's token
      const int32_t me = rank_;
      std::memcpy(hello, &me, 4);
      std::memcpy(hello + 4, &token_, 8);
      const ssize_t n = ::send(fd, hello, sizeof hello, MSG_NOSIGNAL);
      (void)n;
      peers_.push_back({fd, 0, false});
    }
  }
  if (::pipe2(wake_, O_CLOEXEC) != 0) {
    wake_[0] = wake_[1] = -1;
    return;
  }
  thread_ = std::thread([this] { run(); });
}

RankWatch::~RankWatch() {
  stop_ = true;
  if (wake_[1] >= 0) {
    const ssize_t n = ::write(wake_[1], "x", 1);
    (void)n;
  }
  if (thread_.joinable()) thread_.join();
  for (Peer& p : peers_) {
    send_byte(p.fd, kBye);
    ::close(p.fd);
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_) {
    if (fd >= 0) ::close(fd);
  }
}

void RankWatch::run() {
  std::vector<std::string> hello;  // world rank 0: the bytes of each peer's hello so far
  while (!stop_) {
    std::vector<pollfd> fds;
    fds.push_back({wake_[0], POLLIN, 0});
    const bool accepting = listen_fd_ >= 0 && expected_ > 0;
    if (accepting) fds.push_back({listen_fd_, POLLIN, 0});
    const size_t first_peer = fds.size();
    for (const Peer& p : peers_) fds.push_back({p.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 1000) < 0) continue;
    if (fds[0].revents) break;
    if (accepting && fds[1].revents) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        peers_.push_back({fd, -1, false});
        hello.resize(peers_.size());
      }
    }
    hello.resize(peers_.size());
    for (size_t i = 0; i < peers_.size() && first_peer + i < fds.size(); ++i) {
      if (!fds[first_peer + i].revents) continue;
      Peer& p = peers_[i];
      char buf[64];
      const ssize_t n = ::recv(p.fd, buf, sizeof buf, 0);
      if (n > 0) {
        size_t at = 0;
        if (p.rank < 0) {  // world rank 0: the hello first
          const size_t take = std::min<size_t>(kHelloBytes - hello[i].size(), static_cast<size_t>(n));
          hello[i].append(buf, take);
          at = take;
          if (hello[i].size() == kHelloBytes) {
            int32_t r = -1;
            uint64_t token = 0;
            std::memcpy(&r, hello[i].data(), 4);
            std::memcpy(&token, hello[i].data() + 4, 8);
            if (token != token_ || r <= 0 || static_cast<size_t>(r) >= names_.size()) {
              ::close(p.fd);  // not one of this job's ranks: dropped, never a death
              p.fd = -1;
              continue;
            }
            p.rank = r;
            if (--expected_ == 0) {  // every rank is here: nobody else may connect
              ::close(listen_fd_);
              listen_fd_ = -1;
            }
          }
        }
        for (size_t k = at; k < static_cast<size_t>(n); ++k) p.bye = p.bye || buf[k] == kBye;
        continue;
      }
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      // Closed: an orderly end said bye first; anything else is a process that ended
      // (a connection that never said its hello is no rank of this job).
      if (p.rank >= 0 && !p.bye && !stop_ && on_death_) on_death_(p.rank, names_[static_cast<size_t>(p.rank)]);
      ::close(p.fd);
      p.fd = -1;
    }
    for (size_t i = peers_.size(); i-- > 0;) {
      if (peers_[i].fd < 0) {
        peers_.erase(peers_.begin() + static_cast<long>(i));
        hello.erase(hello.begin() + static_cast<long>(i));
      }
    }
  }
}

}  // namespace linnet
