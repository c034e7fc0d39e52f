#include "comm/store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "comm/comm.h"
#include "core/error.h"

namespace lfc::comm {

namespace {

enum Cmd : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kHello = 5 };

using Clock = std::chrono::steady_clock;

int msLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : int(std::min<int64_t>(left, 1 << 30));
}

// A connected socket to host:port, or −1 (errno text in `why`).
int dial(const std::string& host, int port, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    why = gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    why = std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout)
    : where_(cat(host, ":", port)), timeout_(timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string why;
  while ((fd_ = dial(host, port, why)) < 0) {
    if (Clock::now() >= deadline)
      throw CommError(cat("rendezvous: cannot reach the store at ", where_, " within ",
                          timeout.count() / 1000.0, " s: ", why));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) close(fd_);
}

std::vector<char> TcpStore::request(uint8_t cmd, const std::vector<std::string>& parts,
                                    std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string msg(1, char(cmd));
  const auto u32 = [&msg](uint32_t v) {
    for (int i = 0; i < 4; i++) msg.push_back(char((v >> (8 * i)) & 0xff));
  };
  u32(uint32_t(parts.size()));
  for (const auto& p : parts) {
    u32(uint32_t(p.size()));
    msg += p;
  }
  const auto deadline = Clock::now() + timeout;
  const auto lost = [&](const std::string& why) {
    return CommError(cat("rendezvous: the store at ", where_, " ", why));
  };
  for (size_t sent = 0; sent < msg.size();) {
    const ssize_t n = ::send(fd_, msg.data() + sent, msg.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw lost(cat("went away (", std::strerror(errno), ")"));
    sent += size_t(n);
  }
  // reply: u32 length, then the bytes
  std::vector<char> buf;
  size_t want = 4;
  bool header = true;
  std::vector<char> got;
  while (true) {
    while (got.size() < want) {
      pollfd p{fd_, POLLIN, 0};
      const int r = poll(&p, 1, msLeft(deadline));
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) throw CommError("timeout");  // the caller names what it waited for
      char tmp[65536];
      const ssize_t n = ::recv(fd_, tmp, std::min(sizeof(tmp), want - got.size()), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw lost("closed the connection");
      got.insert(got.end(), tmp, tmp + n);
    }
    if (!header) return got;
    uint32_t len = 0;
    for (int i = 0; i < 4; i++) len |= uint32_t(uint8_t(got[size_t(i)])) << (8 * i);
    got.clear();
    want = len;
    header = false;
    if (len == 0) return got;
  }
}

void TcpStore::hello(const std::string& name) { request(kHello, {name}, timeout_); }

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  request(kSet, {key, std::string(data.begin(), data.end())}, timeout_);
}

std::optional<std::vector<char>> TcpStore::tryGet(const std::string& key, std::chrono::milliseconds timeout) {
  std::vector<char> r = request(kGet, {key}, timeout);
  if (r.empty() || r[0] == 0) return std::nullopt;
  return std::vector<char>(r.begin() + 1, r.end());
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  auto v = tryGet(key);
  if (!v) throw CommError(cat("rendezvous: key ", key, " vanished from the store at ", where_));
  return *v;
}

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  try {
    request(kWait, keys, timeout);
  } catch (const CommError& e) {
    if (std::string(e.what()) != "timeout") throw;
    std::string names;
    for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
    // the connection now holds a pending reply: it is unusable, like the rendezvous
    throw CommError(cat("rendezvous: timed out after ", timeout.count() / 1000.0, " s waiting for ", names,
                        " at the store ", where_, " (did every rank start?)"));
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string d(8, '\0');
  for (int i = 0; i < 8; i++) d[size_t(i)] = char((uint64_t(delta) >> (8 * i)) & 0xff);
  std::vector<char> r = request(kAdd, {key, d}, timeout_);
  if (r.size() != 8) throw CommError(cat("rendezvous: the store at ", where_, " answered add with ", r.size(), " bytes"));
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= uint64_t(uint8_t(r[size_t(i)])) << (8 * i);
  return int64_t(v);
}

}  // namespace lfc::comm
