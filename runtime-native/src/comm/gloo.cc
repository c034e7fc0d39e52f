// The Gloo backend: one Gloo context per (group, stream), all over one TCP device, met at the
// launcher's store (or a FileStore on one machine).
//
// Transports: a group whose ranks share one machine runs its collectives through shared memory
// (shm.h, set up over the group's Gloo context when it opens), and only send/recv over TCP. At
// 64 MiB on 2 cores, all-reduce through shared memory ran at 3.9–5.8× OpenMPI's speed on 2 and 4
// ranks, over loopback TCP at 0.85–0.97× (bench/collectives.ts). Otherwise, over TCP: a float
// all_reduce is Gloo's halving-doubling (bandwidth-optimal, and as fast as ring-chunked over
// loopback), an integer one Gloo's ring with segments of at least kMinSegmentBytes (its default
// 1 MiB segments are slow over loopback, ../shared/reference/anchors.md); reduce_scatter is direct
// (tcpReduceScatter: each rank receives only its block, and sums it in group order as shared
// memory does; 0.41–0.49 of the all-reduce's time at 64 MiB on 2 and 4 ranks); all_gather, broadcast and all-to-all are Gloo's; send/recv are unbound-buffer
// transfers in a slot range of their own. Each call carries the timeout; Gloo's exceptions become
// CommError.
//
// Failures (comm.h): abort puts the reason in the store, sets the shared-memory abort word, and
// shuts down the sockets of every TCP connection of the backend's contexts (shutDownSockets): the
// Gloo pairs on both sides read the end of the stream and fail what waits on them, so this rank's
// own waiters wake, and each peer finds the reason in the store. A connection closed with no
// reason in the store is a member gone: errors name the rank whose pair's socket Gloo closed
// (closedPeer; each pair's socket is found when the context opens, learnPeerAddresses).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/alltoallv.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "comm/comm.h"
#include "comm/shm.h"
#include "comm/store.h"
#include "comm/sum.h"
#include "core/bf16.h"
#include "core/error.h"
#include "generated/schema.h"
#include "kernels/cpu/storage.h"

namespace lfc::comm {

namespace {

// segments of Gloo's ring all-reduce: ≥ 4 MiB (anchors.md), larger for large buffers
constexpr size_t kMinSegmentBytes = size_t(4) << 20;
// send/recv slots: above every collective's slot prefix (Gloo's prefixes are small)
constexpr uint64_t kP2PSlotBase = uint64_t(0x7f) << 56;
// reduce_scatter over TCP: the bytes of one message (one peer's piece of a round), and its slots
// (a prefix of their own, between Gloo's and send/recv's; the round's index below)
constexpr size_t kReduceScatterSegmentBytes = size_t(1) << 20;
constexpr uint64_t kReduceScatterSlotBase = uint64_t(0x7e) << 56;
// the first message of each pair of a new context (primeSendBuffers), and how many peers at once
constexpr size_t kPrimeBytes = size_t(256) << 10;
constexpr int kPrimePeersAtOnce = 64;

// Gloo's TCP pair sizes its socket's SO_SNDBUF to the message when it writes one synchronously
// (tcp::Pair::send) and the cached size is smaller, but never when the loop thread finishes a
// deferred write (an unbound-buffer send whose peer had not yet posted its recv). A first message
// of a few bytes (the counts of an all_to_all_v) thus pins SO_SNDBUF at the kernel's minimum,
// 4608 bytes: one 64 KiB loopback segment in flight, each waiting for the peer's delayed ACK
// (40 ms), so a 2 MiB all_to_all_v took 1.5–2 s (bench/overlap.ts). One bound-buffer message of
// kPrimeBytes each way on every pair, before anything else, sizes the buffers for good (Gloo only
// grows them after that).
void primeSendBuffers(gloo::Context& ctx) {
  std::vector<char> out(kPrimeBytes);
  for (int first = 0; first < ctx.size; first += kPrimePeersAtOnce) {
    const int last = std::min(ctx.size, first + kPrimePeersAtOnce);
    std::vector<char> in(kPrimeBytes * size_t(last - first));
    const int slot = ctx.nextSlot();
    std::vector<std::unique_ptr<gloo::transport::Buffer>> sends, recvs;
    for (int j = first; j < last; j++) {
      if (j == ctx.rank) continue;
      auto& pair = ctx.getPair(j);
      recvs.push_back(pair->createRecvBuffer(slot, in.data() + kPrimeBytes * size_t(j - first), kPrimeBytes));
      sends.push_back(pair->createSendBuffer(slot, out.data(), kPrimeBytes));
    }
    for (auto& b : sends) b->send();
    for (auto& b : sends) b->waitSend();
    for (auto& b : recvs) b->waitRecv();
  }
}

template <typename T>
void sumInto(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; i++) out[i] = x[i] + y[i];
}

const char* streamName(int stream) {
  return stream == kControlStream ? "control" : schema::kStreams[stream];
}

// Gloo's FileStore, with the look-up without waiting that its own wait polls with
using FileStoreBase = gloo::rendezvous::FileStore;
class FileStore : public FileStoreBase {
 public:
  using FileStoreBase::FileStoreBase;
  std::optional<std::vector<char>> tryGet(const std::string& key) {
    if (!check({key})) return std::nullopt;
    return get(key);
  }
};

// Whether a socket address is `end` as Gloo's Address::str writes it: "[127.0.0.1]:41234", where
// Debian's Gloo writes the port as it lies in the address (network byte order), so both readings
// of the port are accepted.
bool sameEnd(const sockaddr_storage& ss, const std::string& end) {
  char ip[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    port = a->sin_port;
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
    port = a->sin6_port;
  } else {
    return false;
  }
  if (end.find(cat("[", ip, "]")) == std::string::npos) return false;
  for (const int p : {int(port), int(ntohs(port))}) {
    const std::string suffix = cat("]:", p);
    if (end.size() > suffix.size() && end.compare(end.size() - suffix.size(), suffix.size(), suffix) == 0)
      return true;
  }
  return false;
}

// The ends of a backend's TCP connections, as Gloo names them: each pair's listening address on
// either side (Gloo's Pair::address, and the peer's, learnt when the context opens). A connection
// is a pair's if this side accepted it on its own listening address, or dialled the peer's.
struct PairEnds {
  std::vector<std::string> local, peer;
};

// Shuts down (both ways) every socket of this process that is one of the pairs' connections: both
// Gloo pairs of each connection then read the end of their stream, fail every operation pending on
// them and close. Gloo offers no way to fail a pair from outside that reaches this side's waiters
// too (Pair::close only closes the socket, and its TCP pair's header is not installed), so the
// sockets are found by their addresses.
void shutDownSockets(const PairEnds& ends) noexcept {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  const auto any = [](const sockaddr_storage& ss, const std::vector<std::string>& list) {
    return std::any_of(list.begin(), list.end(), [&](const std::string& e) { return sameEnd(ss, e); });
  };
  while (const dirent* e = readdir(dir)) {
    char* endOfNumber = nullptr;
    const long fd = std::strtol(e->d_name, &endOfNumber, 10);
    if (endOfNumber == e->d_name || *endOfNumber != 0 || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t localLen = sizeof local, peerLen = sizeof peer;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &localLen) != 0) continue;
    const bool connected = getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &peerLen) == 0;
    if (any(local, ends.local) || (connected && any(peer, ends.peer))) shutdown(int(fd), SHUT_RDWR);
  }
  closedir(dir);
}

// A pair's connection as this process holds it: its socket and both ends' addresses.
struct PairSocket {
  int fd = -1;
  sockaddr_storage local{}, peer{};
  socklen_t localLen = 0, peerLen = 0;
  // Gloo closes a pair's socket when the connection fails: gone, or the number reused
  bool closed() const {
    sockaddr_storage l{}, p{};
    socklen_t ll = sizeof l, pl = sizeof p;
    return getsockname(fd, reinterpret_cast<sockaddr*>(&l), &ll) != 0 ||
           getpeername(fd, reinterpret_cast<sockaddr*>(&p), &pl) != 0 || ll != localLen || pl != peerLen ||
           std::memcmp(&l, &local, ll) != 0 || std::memcmp(&p, &peer, pl) != 0;
  }
};

// For each pair j (its listening address localEnds[j] here, peerEnds[j] at the peer; "" for none),
// its connection's socket, found as shutDownSockets finds them.
std::vector<std::optional<PairSocket>> pairSockets(const std::vector<std::string>& localEnds,
                                                   const std::vector<std::string>& peerEnds) {
  std::vector<std::optional<PairSocket>> out(localEnds.size());
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return out;
  while (const dirent* e = readdir(dir)) {
    char* endOfNumber = nullptr;
    const long fd = std::strtol(e->d_name, &endOfNumber, 10);
    if (endOfNumber == e->d_name || *endOfNumber != 0 || fd == dirfd(dir)) continue;
    PairSocket s;
    s.fd = int(fd);
    s.localLen = sizeof s.local;
    s.peerLen = sizeof s.peer;
    if (getsockname(s.fd, reinterpret_cast<sockaddr*>(&s.local), &s.localLen) != 0) continue;
    if (getpeername(s.fd, reinterpret_cast<sockaddr*>(&s.peer), &s.peerLen) != 0) continue;
    for (size_t j = 0; j < localEnds.size(); j++)
      if ((!localEnds[j].empty() && sameEnd(s.local, localEnds[j])) ||
          (!peerEnds[j].empty() && sameEnd(s.peer, peerEnds[j])))
        out[j] = s;
  }
  closedir(dir);
  return out;
}

// What the communicators of a backend share about a failure: this rank's reason, once it aborted,
// and the run's store, where an aborting rank leaves its reason for the others (key `prefix/abort`).
class AbortBoard {
 public:
  AbortBoard(gloo::rendezvous::Store& store, std::string key) : store_(store), key_(std::move(key)) {}

  // The first reason stays. True for the call that set it.
  bool set(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!reason_.empty()) return false;
    reason_ = reason;
    return true;
  }
  std::string local() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }
  // Into the store, unless another rank's reason is there already. Best effort: the store may be
  // gone with the rank that hosted it.
  void post(const std::string& reason) noexcept {
    try {
      if (!posted().empty()) return;
      store_.set(key_, std::vector<char>(reason.begin(), reason.end()));
    } catch (...) {
    }
  }
  // The reason some rank left in the store, or "".
  std::string posted() noexcept {
    try {
      std::optional<std::vector<char>> v;
      if (auto* tcp = dynamic_cast<TcpStore*>(&store_)) v = tcp->tryGet(key_, kLookupTimeout);
      else if (auto* file = dynamic_cast<FileStore*>(&store_)) v = file->tryGet(key_);
      return v ? std::string(v->begin(), v->end()) : "";
    } catch (...) {
      return "";
    }
  }

 private:
  // a look-up on a failure path: the store answers at once or is gone
  static constexpr std::chrono::milliseconds kLookupTimeout{2000};
  gloo::rendezvous::Store& store_;
  const std::string key_;
  mutable std::mutex mu_;
  std::string reason_;
};

class GlooComm : public Communicator {
 public:
  // ranks: the global rank of each group rank
  GlooComm(std::string name, std::shared_ptr<gloo::Context> ctx, std::vector<int> ranks,
           std::shared_ptr<AbortBoard> board, std::chrono::milliseconds timeout)
      : name_(std::move(name)), ctx_(std::move(ctx)), ranks_(std::move(ranks)), board_(std::move(board)),
        timeout_(timeout) {}

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  const std::string& name() const override { return name_; }
  std::string transport() const override { return shm_ ? "shared memory" : "tcp"; }
  bool direct() const override { return shm_ && shm_->direct(); }

  // Collective over the group: from now on the collectives go through shared memory when every
  // member is on this machine (and may), else stay on Gloo.
  void openSharedMemory(bool allowed, const std::vector<SharedRange>& shared, int threads) {
    ShmGroup::Exchange exchange{
        [this](void* p, size_t n) { broadcast(p, int64_t(n), 0); },
        [this](int32_t* v) { glooAllReduce(v, DType::i32, 1, -1); },
    };
    shm_ = ShmGroup::connect(rank(), ranks_, allowed, timeout_, exchange, shared, threads);
  }

  // Collective over the group, before shared memory opens: each peer's address for its pair with
  // this rank ("[127.0.0.1]:41234", Gloo's Pair::address), which finds the pair's connection
  // (pairSockets), so that abort can shut it down and a closed one names its rank. Block j of the
  // exchange is this rank's address for its pair with rank j.
  void learnPeerAddresses() {
    constexpr int64_t kBytes = 64;
    const int P = size();
    std::vector<char> mine(size_t(P * kBytes), 0), theirs(size_t(P * kBytes), 0);
    localEnds_.assign(size_t(P), "");
    for (int j = 0; j < P; j++) {
      if (j == rank()) continue;
      const std::string at = ctx_->getPair(j)->address().str();
      localEnds_[size_t(j)] = at;
      std::memcpy(mine.data() + j * kBytes, at.data(), std::min<size_t>(at.size(), kBytes - 1));
    }
    const std::vector<int64_t> blocks(size_t(P), kBytes);
    allToAllV(mine.data(), blocks, theirs.data(), blocks);
    peerAddresses_.assign(size_t(P), "");
    for (int j = 0; j < P; j++)
      if (j != rank()) {
        const char* at = theirs.data() + j * kBytes;
        peerAddresses_[size_t(j)] = std::string(at, strnlen(at, kBytes));
      }
    pairSockets_ = pairSockets(localEnds_, peerAddresses_);
  }

  // Backend::abort's part for this communicator: the shared-memory word (its TCP connections are
  // shut down with the backend's, localEnds)
  void abort(const std::string& reason) noexcept {
    if (shm_) shm_->abort(reason);
  }
  // this rank's listening address for each peer's pair, and each peer's for this rank's
  const std::vector<std::string>& localEnds() const { return localEnds_; }
  const std::vector<std::string>& peerEnds() const { return peerAddresses_; }

  void allReduce(void* data, DType dtype, int64_t count, int64_t key) override {
    if (count == 0) return;
    if (shm_) return shm_->allReduce(data, dtype, count);
    glooAllReduce(data, dtype, count, key);
  }

  void reduceScatter(const void* in, void* out, DType dtype, int64_t blockCount) override {
    if (blockCount == 0) return;
    if (shm_) return shm_->reduceScatter(in, out, dtype, blockCount);
    switch (dtype) {
      case DType::f32: return tcpReduceScatter(static_cast<const float*>(in), static_cast<float*>(out), blockCount);
      case DType::f64:
        return tcpReduceScatter(static_cast<const double*>(in), static_cast<double*>(out), blockCount);
      case DType::bf16: return tcpReduceScatter(static_cast<const bf16*>(in), static_cast<bf16*>(out), blockCount);
      case DType::i32:
        return tcpReduceScatter(static_cast<const int32_t*>(in), static_cast<int32_t*>(out), blockCount);
      case DType::i64:
        return tcpReduceScatter(static_cast<const int64_t*>(in), static_cast<int64_t*>(out), blockCount);
      default:
        throw CommError(cat("reduce-scatter of ", dtypeName(dtype), " is not supported (f32, f64, bf16, i32, i64)"));
    }
  }

  void allGather(const void* in, void* out, int64_t blockBytes) override {
    if (blockBytes == 0) return;
    if (shm_) return shm_->allGather(in, out, blockBytes);
    gloo::AllgatherOptions o(ctx_);
    o.setTimeout(timeout_);
    o.setInput(static_cast<char*>(const_cast<void*>(in)), size_t(blockBytes));
    o.setOutput(static_cast<char*>(out), size_t(blockBytes) * size_t(size()));
    guard([&] { gloo::allgather(o); });
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    if (bytes == 0) return;
    if (shm_) return shm_->broadcast(data, bytes, root);
    gloo::BroadcastOptions o(ctx_);
    o.setTimeout(timeout_);
    o.setRoot(root);
    o.setOutput(static_cast<char*>(data), size_t(bytes));
    guard([&] { gloo::broadcast(o); });
  }

  void allToAllV(const void* in, const std::vector<int64_t>& sendBytes, void* out,
                 const std::vector<int64_t>& recvBytes) override {
    if (shm_) return shm_->allToAllV(in, sendBytes, out, recvBytes);
    gloo::AlltoallvOptions o(ctx_);
    o.setTimeout(timeout_);
    // Gloo wants non-null pointers even for empty buffers
    static char empty[1];
    o.setInput(in ? static_cast<char*>(const_cast<void*>(in)) : empty, sendBytes);
    o.setOutput(out ? static_cast<char*>(out) : empty, recvBytes);
    guard([&] { gloo::alltoallv(o); });
  }

  void gatherV(const void* in, void* out, const std::vector<int64_t>& blockBytes, int root) override {
    if (shm_) return shm_->gatherV(in, out, blockBytes, root);
    Communicator::gatherV(in, out, blockBytes, root);
  }

  void send(const void* data, int64_t bytes, int peer, uint32_t tag) override {
    auto buf = ctx_->createUnboundBuffer(const_cast<void*>(data), size_t(bytes));
    guard([&] {
      buf->send(peer, kP2PSlotBase | tag);
      buf->waitSend(timeout_);
    });
  }

  void recv(void* data, int64_t bytes, int peer, uint32_t tag) override {
    auto buf = ctx_->createUnboundBuffer(data, size_t(bytes));
    guard([&] {
      buf->recv(peer, kP2PSlotBase | tag);
      buf->waitRecv(timeout_);
    });
  }

  void postSend(const void* data, int64_t bytes, int peer, uint32_t tag) override {
    auto buf = ctx_->createUnboundBuffer(const_cast<void*>(data), size_t(bytes));
    guard([&] { buf->send(peer, kP2PSlotBase | tag); });
    postedSends_.push_back(std::move(buf));
  }

  void postRecv(void* data, int64_t bytes, int peer, uint32_t tag) override {
    auto buf = ctx_->createUnboundBuffer(data, size_t(bytes));
    guard([&] { buf->recv(peer, kP2PSlotBase | tag); });
    postedRecvs_.push_back(std::move(buf));
  }

  void waitPosted() override {
    auto sends = std::move(postedSends_);
    auto recvs = std::move(postedRecvs_);
    postedSends_.clear();
    postedRecvs_.clear();
    guard([&] {
      for (auto& b : recvs) b->waitRecv(timeout_);
      for (auto& b : sends) b->waitSend(timeout_);
    });
  }

 private:
  void glooAllReduce(void* data, DType dtype, int64_t count, int64_t key) {
    if (dtype == DType::bf16) return bf16AllReduce(static_cast<bf16*>(data), count, key);
    if (key >= 0 && dtype == DType::f32) return halvingDoubling(static_cast<float*>(data), count, key);
    if (key >= 0 && dtype == DType::f64) return halvingDoubling(static_cast<double*>(data), count, key);
    gloo::AllreduceOptions o(ctx_);
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    o.setTimeout(timeout_);
    const size_t bytes = size_t(count) * size_t(dtypeBytes(dtype));
    o.setMaxSegmentSize(std::max(kMinSegmentBytes, bytes / size_t(2 * size()) + 1));
    switch (dtype) {
      case DType::f32: setup<float>(o, data, count); break;
      case DType::f64: setup<double>(o, data, count); break;
      case DType::i32: setup<int32_t>(o, data, count); break;
      case DType::i64: setup<int64_t>(o, data, count); break;
      default: throw CommError(cat("all-reduce of ", dtypeName(dtype), " is not supported (f32, f64, bf16, i32, i64)"));
    }
    guard([&] { gloo::allreduce(o); });
  }

  // Gloo's halving-doubling all-reduce binds its buffers when built (a collective step of its
  // own), so one is kept per call `key`: every member of the group names the call alike, so all
  // build or all reuse (keying by address would not do: ranks running different programs hold
  // the same tensor at different addresses). A key's buffer is fixed on a rank (plan buffers keep
  // their addresses); its count may follow the microbatch's sizes, alike on every member.
  template <typename T>
  void halvingDoubling(T* data, int64_t count, int64_t key) {
    if (count > INT32_MAX) throw CommError(cat("all-reduce of ", count, " elements is over Gloo's limit"));
    Bound& b = bound_[key];
    if (!b.algorithm || b.data != data || b.count != count) {
      b.algorithm.reset();
      guard([&] {
        b.algorithm = std::make_unique<gloo::AllreduceHalvingDoubling<T>>(ctx_, std::vector<T*>{data}, int(count));
      });
      b.data = data;
      b.count = count;
    }
    guard([&] { b.algorithm->run(); });
  }

  // bf16 over TCP: the f32 all-reduce on an f32 copy, rounded to bf16 once at the end (a bf16
  // sum inside Gloo's algorithms would round at every step of the exchange); the wire carries f32.
  // The copy is taken from this thread's scratch (on the comm stream: its planned slice, counted
  // by compiler/plan/scratch.ts). The executor resets the scratch before every instruction, so an
  // instruction's copy sits at the same address every step while its count and the takes before
  // it (a function of the instruction's sizes) are the same: the halving-doubling bound to it is
  // rebuilt exactly when those change, alike on every member.
  void bf16AllReduce(bf16* data, int64_t count, int64_t key) {
    cpu::ScratchScope scratch;
    float* sum = scratch.take<float>(count);  // (count)
    floatFromBf16(sum, data, count);
    glooAllReduce(sum, DType::f32, count, key);
    bf16FromFloat(data, sum, count);
  }

  // Reduce-scatter over TCP, directly: rank r sends block j of `in` to rank j and receives block r
  // from every other rank, in rounds of kReduceScatterSegmentBytes per peer. The sends are posted
  // at once, from `in` itself; the receives land in two halves of a staging buffer of P−1 segments
  // each, so that one round arrives while the one before is summed (with this rank's own piece,
  // straight from `in`, in group order). Traffic per rank: (P−1)/P of `in` out and as much in,
  // half of the all-reduce's; bf16 travels as bf16 (summed in f32 on arrival). The staging buffer
  // is the communicator's own, at most 2·(P−1) segments, kept between calls.
  template <typename T>
  void tcpReduceScatter(const T* in, T* out, int64_t blockCount) {
    const int P = size(), r = rank();
    const int64_t seg = std::min(blockCount, int64_t(kReduceScatterSegmentBytes / sizeof(T)));  // elements
    const int64_t rounds = (blockCount + seg - 1) / seg;
    if (rounds > int64_t(UINT32_MAX))
      throw CommError(cat("reduce-scatter of ", blockCount, " elements a block is too large"));
    const size_t halfBytes = size_t(P - 1) * size_t(seg) * sizeof(T);
    if (staging_.size() < 2 * halfBytes) staging_.assign(2 * halfBytes, std::byte{0});
    T* staged[2] = {reinterpret_cast<T*>(staging_.data()), reinterpret_cast<T*>(staging_.data() + halfBytes)};
    // peer j's piece of a round sits at index j (j < r) or j − 1 (j > r) of its half
    const auto laneOf = [r](int j) { return j < r ? j : j - 1; };
    const auto slotOf = [](int64_t k) { return kReduceScatterSlotBase | uint64_t(k); };
    const auto pieceOf = [&](int64_t k) { return std::min(seg, blockCount - k * seg); };
    guard([&] {
      auto sends = ctx_->createUnboundBuffer(const_cast<T*>(in), size_t(P) * size_t(blockCount) * sizeof(T));
      std::unique_ptr<gloo::transport::UnboundBuffer> halves[2] = {
          ctx_->createUnboundBuffer(staged[0], halfBytes), ctx_->createUnboundBuffer(staged[1], halfBytes)};
      const auto postRecvs = [&](int64_t k) {
        for (int j = 0; j < P; j++)
          if (j != r)
            halves[k % 2]->recv(j, slotOf(k), size_t(laneOf(j)) * size_t(seg) * sizeof(T),
                                size_t(pieceOf(k)) * sizeof(T));
      };
      for (int64_t k = 0; k < std::min<int64_t>(2, rounds); k++) postRecvs(k);
      for (int64_t k = 0; k < rounds; k++)
        for (int j = 0; j < P; j++)
          if (j != r)
            sends->send(j, slotOf(k), (size_t(j) * size_t(blockCount) + size_t(k * seg)) * sizeof(T),
                        size_t(pieceOf(k)) * sizeof(T));
      std::vector<const T*> parts(static_cast<size_t>(P), nullptr);
      for (int64_t k = 0; k < rounds; k++) {
        for (int j = 1; j < P; j++) halves[k % 2]->waitRecv(timeout_);
        for (int j = 0; j < P; j++)
          parts[size_t(j)] = j == r ? in + r * blockCount + k * seg : staged[k % 2] + laneOf(j) * seg;
        sumParts(out + k * seg, parts.data(), P, pieceOf(k));
        if (k + 2 < rounds) postRecvs(k + 2);
      }
      for (int64_t k = 0; k < rounds * (P - 1); k++) sends->waitSend(timeout_);
    });
  }

  template <typename T>
  static void setup(gloo::AllreduceOptions& o, void* data, int64_t count) {
    o.setOutput(static_cast<T*>(data), size_t(count));
    o.setReduceFunction(&sumInto<T>);
  }

  // The group rank whose connection with this one failed, or −1: Gloo closes a pair's socket when
  // it fails (moments after it wakes the waiters, hence the few looks). Gloo's error names the
  // pair by the peer's first listening address, which the peer itself no longer knows once it
  // dialled, so the sockets tell rather than the message.
  int closedPeer() const {
    for (int look = 0; look < 20; look++) {
      for (size_t j = 0; j < pairSockets_.size(); j++)
        if (pairSockets_[j] && pairSockets_[j]->closed()) return int(j);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return -1;
  }

  // Gloo's exceptions as CommError: a failure this rank or another aborted with is a PeerFailure
  // with its reason, a timeout says which timeout it was, a connection closed without a reason
  // names the rank at its other end
  template <typename F>
  void guard(F&& f) {
    try {
      f();
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      if (const std::string reason = board_->local(); !reason.empty()) throw PeerFailure(reason);
      if (const std::string reason = board_->posted(); !reason.empty()) throw PeerFailure(reason);
      const std::string what = e.what();
      // the unbound-buffer ops say "Timed out waiting …", the bound ones "Read timeout …"
      if (what.find("imed out") != std::string::npos || what.find("timeout") != std::string::npos)
        throw CommError(cat("timed out after ", timeout_.count() / 1000.0,
                            " s (--collective-timeout): a rank of the group did not take part"));
      if (const int j = closedPeer(); j >= 0)
        throw PeerFailure(
            cat("rank ", ranks_[size_t(j)], " closed its connection (its process exited, or its machine went away)"));
      // Gloo prefixes messages with its source location in brackets
      const size_t cut = what.find("] ");
      throw CommError(cut == std::string::npos ? what : what.substr(cut + 2));
    }
  }

  std::string name_;
  std::shared_ptr<gloo::Context> ctx_;
  std::vector<int> ranks_;                   // global rank of each group rank
  std::vector<std::string> peerAddresses_;  // per group rank: its pair's listening address for this one
  std::vector<std::string> localEnds_;      // per group rank: this rank's pair's listening address
  std::vector<std::optional<PairSocket>> pairSockets_;  // per group rank: its connection with this one
  std::shared_ptr<AbortBoard> board_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> postedSends_, postedRecvs_;
  std::chrono::milliseconds timeout_;
  struct Bound {
    void* data = nullptr;
    int64_t count = 0;
    std::unique_ptr<gloo::Algorithm> algorithm;
  };
  std::map<int64_t, Bound> bound_;
  std::vector<std::byte> staging_;  // tcpReduceScatter's two halves of received segments
  std::unique_ptr<ShmGroup> shm_;
};

// A group of one rank: every primitive is a local copy.
class SelfComm : public Communicator {
 public:
  explicit SelfComm(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  std::string transport() const override { return "local"; }
  void allReduce(void*, DType, int64_t, int64_t) override {}
  void reduceScatter(const void* in, void* out, DType dtype, int64_t blockCount) override {
    if (in != out && blockCount > 0) std::memmove(out, in, size_t(blockCount * dtypeBytes(dtype)));
  }
  void allGather(const void* in, void* out, int64_t blockBytes) override {
    if (in != out && blockBytes > 0) std::memmove(out, in, size_t(blockBytes));
  }
  void broadcast(void*, int64_t, int) override {}
  void allToAllV(const void* in, const std::vector<int64_t>& sendBytes, void* out,
                 const std::vector<int64_t>& recvBytes) override {
    if (sendBytes.at(0) != recvBytes.at(0)) throw CommError("all-to-all of one rank: sizes differ");
    if (sendBytes[0] > 0) std::memmove(out, in, size_t(sendBytes[0]));
  }
  void send(const void*, int64_t, int, uint32_t) override {
    throw CommError("send to itself in a group of one rank");
  }
  void recv(void*, int64_t, int, uint32_t) override {
    throw CommError("recv from itself in a group of one rank");
  }
  void postSend(const void*, int64_t, int, uint32_t) override {
    throw CommError("send to itself in a group of one rank");
  }
  void postRecv(void*, int64_t, int, uint32_t) override {
    throw CommError("recv from itself in a group of one rank");
  }
  void waitPosted() override {}

 private:
  std::string name_;
};

class GlooBackend : public Backend {
 public:
  explicit GlooBackend(const Config& c) : config_(c) {
    if (c.rank < 0 || c.rank >= c.worldSize)
      throw CommError(cat("rank ", c.rank, " is out of range for world size ", c.worldSize));
    if (c.store.rfind("tcp:", 0) == 0) {
      const std::string hostPort = c.store.substr(4);
      const size_t colon = hostPort.rfind(':');
      if (colon == std::string::npos) throw CommError(cat("store address '", c.store, "' has no port"));
      auto tcp = std::make_unique<TcpStore>(hostPort.substr(0, colon), std::stoi(hostPort.substr(colon + 1)),
                                            c.timeout);
      tcp->hello(std::to_string(c.rank));
      store_ = std::move(tcp);
    } else if (c.store.rfind("file:", 0) == 0) {
      store_ = std::make_unique<FileStore>(c.store.substr(5));
    } else {
      throw CommError(cat("store address '", c.store, "' is neither tcp:HOST:PORT nor file:DIR"));
    }
    board_ = std::make_shared<AbortBoard>(*store_, cat(c.prefix, "/abort"));
    gloo::transport::tcp::attr attr;
    attr.hostname = c.host;
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      throw CommError(cat("cannot listen on ", c.host, ": ", e.what()));
    }
    // a fixed order on every rank, so that no two ranks wait for each other's next group
    std::vector<ContextSpec> specs = c.contexts;
    specs.push_back({kWorldGroup, kControlStream});
    std::sort(specs.begin(), specs.end());
    specs.erase(std::unique(specs.begin(), specs.end(),
                            [](const ContextSpec& a, const ContextSpec& b) { return !(a < b) && !(b < a); }),
                specs.end());
    for (const ContextSpec& s : specs) open(s);
  }

  const Config& config() const override { return config_; }

  Communicator& at(int group, int stream) override {
    auto it = comms_.find({group, stream});
    if (it == comms_.end())
      throw CommError(cat("no communicator for group ", groupName(group), " on stream ", streamName(stream),
                          " (the plan's collectives did not announce it)"));
    return *it->second;
  }

  std::vector<const Communicator*> communicators() const override {
    std::vector<const Communicator*> out;
    for (const auto& [_, c] : comms_) out.push_back(c.get());
    return out;
  }

  void abort(const std::string& reason) noexcept override {
    try {
      if (!board_->set(reason)) return;
    } catch (...) {
      return;
    }
    // the reason first, so that a peer that sees a closed connection finds it
    board_->post(reason);
    PairEnds ends;
    for (GlooComm* c : gloo_) {
      c->abort(reason);
      for (const std::string& e : c->localEnds())
        if (!e.empty()) ends.local.push_back(e);
      for (const std::string& e : c->peerEnds())
        if (!e.empty()) ends.peer.push_back(e);
    }
    shutDownSockets(ends);
  }

  std::string broken() const override { return board_->local(); }

 private:
  std::string groupName(int group) const {
    return group == kWorldGroup ? "world" : config_.groups.at(size_t(group)).name;
  }

  void open(const ContextSpec& s) {
    std::vector<int> ranks;
    if (s.group == kWorldGroup)
      for (int r = 0; r < config_.worldSize; r++) ranks.push_back(r);
    else if (s.group < 0 || s.group >= int(config_.groups.size()))
      throw CommError(cat("group index ", s.group, " is out of range (", config_.groups.size(), " groups)"));
    else
      ranks = config_.groups[size_t(s.group)].ranks;
    const auto me = std::find(ranks.begin(), ranks.end(), config_.rank);
    if (me == ranks.end()) return;  // not a member
    const std::string name = cat(groupName(s.group), "/", streamName(s.stream));
    if (ranks.size() == 1) {
      comms_[{s.group, s.stream}] = std::make_unique<SelfComm>(name);
      return;
    }
    auto ctx = std::make_shared<gloo::rendezvous::Context>(int(me - ranks.begin()), int(ranks.size()));
    ctx->setTimeout(config_.timeout);
    PrefixedStore store(cat(config_.prefix, "/", name), *store_, config_.timeout);
    try {
      ctx->connectFullMesh(store, device_);
      primeSendBuffers(*ctx);
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(cat("cannot connect group ", name, ": ", e.what()));
    }
    auto comm = std::make_unique<GlooComm>(name, ctx, ranks, board_, config_.timeout);
    try {
      comm->learnPeerAddresses();
      comm->openSharedMemory(shmAllowed(), config_.shared, config_.threads);
    } catch (const CommError& e) {
      throw CommError(cat("cannot connect group ", name, ": ", e.what()));
    }
    gloo_.push_back(comm.get());
    comms_[{s.group, s.stream}] = std::move(comm);
  }

  Config config_;
  std::unique_ptr<gloo::rendezvous::Store> store_;
  std::shared_ptr<AbortBoard> board_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::map<std::pair<int, int>, std::unique_ptr<Communicator>> comms_;
  std::vector<GlooComm*> gloo_;  // the communicators of comms_ over more than one rank
};

}  // namespace

std::unique_ptr<Backend> connectGloo(const Config& config) { return std::make_unique<GlooBackend>(config); }

int groupOf(const Config& config, const std::string& kind) {
  auto it = config.rankGroups.find(kind);
  if (it == config.rankGroups.end()) {
    std::string known;
    for (const auto& [k, _] : config.rankGroups) known += (known.empty() ? "" : ", ") + k;
    throw CommError(cat("group kind '", kind, "' is not in the plan's rankGroups (", known, ")"));
  }
  if (config.rank >= int(it->second.size()))
    throw CommError(cat("rankGroups.", kind, " has no entry for rank ", config.rank));
  return it->second[size_t(config.rank)];
}

}  // namespace lfc::comm
