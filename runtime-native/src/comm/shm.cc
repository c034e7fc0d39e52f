#include "comm/shm.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <map>
#include <mutex>
#include <tuple>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/copy.h"
#include "comm/sum.h"
#include "comm/test_fault.h"
#include "core/bf16.h"
#include "core/error.h"

namespace lfc::comm {

namespace {

// the mapping's first pages: the nonce that proves two ranks opened the same mapping, the
// barrier's counter and generation (each on a cache line of its own), each rank's process id (a
// barrier that waits checks its peers are still there), and the abort word with its reason
constexpr int kMaxRanks = 960;
constexpr size_t kReasonBytes = 2048;
enum AbortState : uint32_t { kRunning = 0, kWriting = 1, kAborted = 2 };
struct Header {
  uint64_t nonce[2];
  alignas(64) std::atomic<uint32_t> arrived;
  alignas(64) std::atomic<uint32_t> generation;
  alignas(64) std::atomic<int32_t> pids[kMaxRanks];
  alignas(64) std::atomic<uint32_t> abortState;  // AbortState; the reason is set once it is kAborted
  char abortReason[kReasonBytes];
};
constexpr size_t kHeaderBytes = 8192;
static_assert(sizeof(Header) <= kHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free);
// per set and rank, one value on a line of its own (allToAllV's round counts)
constexpr size_t kMetaLine = 64;
size_t metaBytes(int P) { return (2 * size_t(P) * kMetaLine + 4095) / 4096 * 4096; }
// per rank, its shared ranges for direct reads: where each lies in its process, its size, and the
// memfd (number, device and inode, so a reader knows it opened that file)
constexpr int kMaxShared = 16;
struct SharedEntry {
  uint64_t base;
  int64_t bytes;
  int64_t fd;
  uint64_t dev, ino;
};
struct SharedTable {
  int64_t count;
  SharedEntry entries[kMaxShared];
};
size_t tableBytes(int P) { return (size_t(P) * sizeof(SharedTable) + 4095) / 4096 * 4096; }

// what rank 0 tells the others first: its machine (hostname and boot id) and process id namespace
// (so that a peer's process id means the same process to every rank)
struct HostKey {
  char text[256];
};

HostKey hostKey() {
  HostKey k{};
  char host[128] = {};
  gethostname(host, sizeof host - 1);
  char boot[64] = {};
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    if (!std::fgets(boot, sizeof boot, f)) boot[0] = 0;
    std::fclose(f);
  }
  char pidns[64] = {};
  if (readlink("/proc/self/ns/pid", pidns, sizeof pidns - 1) < 0) pidns[0] = 0;
  std::snprintf(k.text, sizeof k.text, "%s|%s|%s", host, boot, pidns);
  return k;
}

// then whether it made a mapping, its name and nonce
struct Offer {
  int32_t ok;
  uint32_t pad;
  uint64_t nonce[2];
  char name[64];
};

// barrier polls before sleeping on the futex: short, since ranks may outnumber cores
constexpr int kSpins = 64;
// the longest single futex sleep, so a lost wake-up costs at most this
constexpr auto kMaxSleep = std::chrono::milliseconds(100);

Header* headerOf(void* base) { return static_cast<Header*>(base); }

uint32_t* futexWord(std::atomic<uint32_t>& a) { return reinterpret_cast<uint32_t*>(&a); }

void futexWait(std::atomic<uint32_t>& a, uint32_t expected, std::chrono::nanoseconds wait) {
  timespec ts{time_t(wait.count() / 1'000'000'000), long(wait.count() % 1'000'000'000)};
  // a shared mapping between processes: the non-private futex operations
  syscall(SYS_futex, futexWord(a), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>& a) { syscall(SYS_futex, futexWord(a), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// whether [a, a + n) and [b, b + m) share no byte
bool disjoint(const void* a, int64_t n, const void* b, int64_t m) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x + uintptr_t(n) <= y || y + uintptr_t(m) <= x;
}

// memmove, streamed where the two do not overlap (copy.h)
void moveBlock(void* dst, const void* src, size_t n) {
  if (disjoint(dst, int64_t(n), src, int64_t(n))) copyBlock(dst, src, n);
  else std::memmove(dst, src, n);
}

// the part of a chunk of n elements that rank r reduces: equal parts of whole 64-byte lines
template <typename T>
std::pair<int64_t, int64_t> partOf(int64_t n, int r, int P) {
  constexpr int64_t kLine = 64 / sizeof(T);
  const int64_t part = ((n + P - 1) / P + kLine - 1) / kLine * kLine;
  const int64_t lo = std::min(n, part * r);
  return {lo, std::min(n, lo + part)};
}

// How long a barrier polls before it sleeps on the futex, when the group's computing threads (its
// ranks × each rank's --threads) fit the CPUs this process may run on: a futex sleep and wake-up
// costs tens of microseconds on a virtual machine, against a collective of a few MiB that takes a
// few hundred. Past the CPUs, a poll takes a CPU that a rank's kernels or the rank it waits for
// need: kSpins polls only. LFC_COMM_SPIN_US overrides it (0: kSpins polls only). On 2 ranks of the
// 2-core EPYC, 50 µs took the 4 MiB gather_v from 0.36–0.39 ms to 0.18–0.24 ms (bench/collectives,
// three alternations); 16 MiB moved within the runs' noise. Polling without yielding had a slow
// mode there, in 2 runs of 10: the scheduler kept both ranks' comm threads on one CPU, and
// each barrier waited out the other's spin (gather_v 0.38 ms, all_to_all_v 0.62 ms). Both ranks
// pinned to one CPU reproduced it every time (0.40–0.44 and 0.64–0.73 ms); with the yield,
// 0.18–0.20 and 0.38–0.41 ms.
std::chrono::nanoseconds spinTime(int threads) {
  if (const char* v = std::getenv("LFC_COMM_SPIN_US")) return std::chrono::microseconds(std::atoll(v));
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return threads <= cpus ? std::chrono::microseconds(50) : std::chrono::nanoseconds(0);
}

// LFC_COMM_DIRECT=0: shared-memory groups keep the slots (no direct reads)
bool directAllowed() {
  const char* v = std::getenv("LFC_COMM_DIRECT");
  return !(v && std::string(v) == "0");
}

}  // namespace

bool shmAllowed() {
  const char* v = std::getenv("LFC_COMM_SHM");
  return !(v && std::string(v) == "0");
}

struct ShmGroup::PeerMapping {
  char* at = nullptr;
  size_t bytes = 0;
  ~PeerMapping() { munmap(at, bytes); }
};

namespace {

// Peer regions mapped in this process, by (pid, device, inode): a rank's groups share them.
std::shared_ptr<const ShmGroup::PeerMapping> mapPeerRegion(int32_t pid, const SharedEntry& e) {
  static std::mutex mutex;
  static std::map<std::tuple<int32_t, uint64_t, uint64_t>, std::weak_ptr<const ShmGroup::PeerMapping>> mapped;
  const auto key = std::make_tuple(pid, e.dev, e.ino);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto m = mapped[key].lock(); m && m->bytes >= size_t(e.bytes)) return m;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%lld", int(pid), static_cast<long long>(e.fd));
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* p = MAP_FAILED;
  // the same file the peer named, and as large as it said
  if (fstat(fd, &st) == 0 && uint64_t(st.st_dev) == e.dev && uint64_t(st.st_ino) == e.ino && st.st_size >= e.bytes &&
      e.bytes > 0)
    p = mmap(nullptr, size_t(e.bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return nullptr;
  auto m = std::make_shared<ShmGroup::PeerMapping>();
  m->at = static_cast<char*>(p);
  m->bytes = size_t(e.bytes);
  for (auto it = mapped.begin(); it != mapped.end();)  // drop those whose groups are gone
    it = it->second.expired() ? mapped.erase(it) : std::next(it);
  mapped[key] = m;
  return m;
}

}  // namespace

std::unique_ptr<ShmGroup> ShmGroup::connect(int rank, const std::vector<int>& ranks, bool allowed,
                                            std::chrono::milliseconds timeout, const Exchange& exchange,
                                            const std::vector<SharedRange>& shared, int threads) {
  const int size = int(ranks.size());
  // 1. one machine? (nothing is allocated for a group that spans several)
  const HostKey mine = hostKey();
  HostKey first = mine;
  exchange.broadcast(&first, sizeof first);
  int32_t elsewhere =
      (std::strncmp(first.text, mine.text, sizeof mine.text) != 0 || !allowed || size > kMaxRanks) ? 1 : 0;
  exchange.sum(&elsewhere);
  if (elsewhere > 0) return nullptr;

  // 2. rank 0 makes the mapping, the others open it and check its nonce
  const size_t mapped = kHeaderBytes + metaBytes(size) + tableBytes(size) + 2 * size_t(size) * kExchangeSlotBytes;
  Offer offer{};
  void* base = MAP_FAILED;
  if (rank == 0) {
    std::random_device rd;
    offer.nonce[0] = (uint64_t(rd()) << 32) | rd();
    offer.nonce[1] = (uint64_t(rd()) << 32) | uint64_t(getpid());
    std::snprintf(offer.name, sizeof offer.name, "/lfc-%d-%016llx", int(getpid()),
                  static_cast<unsigned long long>(offer.nonce[0]));
    const int fd = shm_open(offer.name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) {
      // posix_fallocate, not ftruncate: a full /dev/shm is refused now rather than SIGBUS later
      if (posix_fallocate(fd, 0, off_t(mapped)) == 0)
        base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (base == MAP_FAILED) shm_unlink(offer.name);
    }
    if (base != MAP_FAILED) {
      std::memcpy(headerOf(base)->nonce, offer.nonce, sizeof offer.nonce);
      offer.ok = 1;
    }
  }
  exchange.broadcast(&offer, sizeof offer);
  if (rank != 0 && offer.ok) {
    offer.name[sizeof offer.name - 1] = 0;
    const int fd = shm_open(offer.name, O_RDWR, 0);
    struct stat st {};
    if (fd >= 0 && fstat(fd, &st) == 0 && size_t(st.st_size) == mapped)
      base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    // the same name in another /dev/shm (a container of its own) has another nonce
    if (base != MAP_FAILED && std::memcmp(headerOf(base)->nonce, offer.nonce, sizeof offer.nonce) != 0) {
      munmap(base, mapped);
      base = MAP_FAILED;
    }
  }
  int32_t missing = base == MAP_FAILED ? 1 : 0;
  exchange.sum(&missing);
  // every rank that could open it has: the name is no longer needed
  if (rank == 0 && offer.ok) shm_unlink(offer.name);
  if (missing > 0) {
    if (base != MAP_FAILED) munmap(base, mapped);
    return nullptr;
  }
  headerOf(base)->pids[rank].store(int32_t(getpid()), std::memory_order_relaxed);
  std::unique_ptr<ShmGroup> group(new ShmGroup(rank, ranks, base, mapped, timeout, threads));
  group->mapPeers(shared, exchange);
  return group;
}

// Collective: every member writes its shared ranges into the table, then maps every other's; if
// any member has none, or cannot map one, none reads directly.
void ShmGroup::mapPeers(const std::vector<SharedRange>& shared, const Exchange& exchange) {
  auto* table = reinterpret_cast<SharedTable*>(static_cast<char*>(base_) + kHeaderBytes + metaBytes(size_));
  int32_t unable = (!directAllowed() || shared.empty() || shared.size() > size_t(kMaxShared)) ? 1 : 0;
  SharedTable& mine = table[rank_];
  mine.count = 0;
  for (const SharedRange& r : shared) {
    struct stat st {};
    if (unable || fstat(r.fd, &st) != 0) {
      unable = 1;
      break;
    }
    mine.entries[mine.count++] = {uint64_t(reinterpret_cast<uintptr_t>(r.base)), r.bytes, r.fd, uint64_t(st.st_dev),
                                  uint64_t(st.st_ino)};
  }
  exchange.sum(&unable);  // also: every member's table and process id are written
  if (unable > 0) return;
  std::vector<std::vector<PeerRange>> peers(static_cast<size_t>(size_));
  int32_t failed = 0;
  for (int j = 0; j < size_ && !failed; j++) {
    if (j == rank_) continue;
    const int32_t pid = headerOf(base_)->pids[j].load(std::memory_order_relaxed);
    const SharedTable& theirs = table[j];
    for (int64_t k = 0; k < std::min<int64_t>(theirs.count, kMaxShared) && !failed; k++) {
      const SharedEntry& e = theirs.entries[k];
      auto m = testFault("direct_map_refused", ranks_[size_t(rank_)]) ? nullptr : mapPeerRegion(pid, e);
      if (m) peers[size_t(j)].push_back({e.base, e.bytes, std::move(m)});
      else failed = 1;
    }
  }
  exchange.sum(&failed);
  if (failed > 0) return;
  own_ = shared;
  peers_ = std::move(peers);
}

bool ShmGroup::shared(const void* p, int64_t n) const {
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (const SharedRange& r : own_) {
    const auto lo = reinterpret_cast<uintptr_t>(r.base);
    if (at >= lo && at + uintptr_t(n) <= lo + uintptr_t(r.bytes)) return true;
  }
  return false;
}

char* ShmGroup::peerBytes(int j, uint64_t at, int64_t n) const {
  for (const PeerRange& r : peers_[size_t(j)])
    if (at >= r.base && at + uint64_t(n) <= r.base + uint64_t(r.bytes)) return r.map->at + (at - r.base);
  throw CommError(cat("rank ", ranks_[size_t(j)], " offered ", n, " bytes outside its shared memory"));
}

bool ShmGroup::publish(int set, bool ok, const std::vector<uint64_t>& where) {
  meta(set, rank_)[1] = ok ? 1 : 0;
  std::memcpy(slot(set, rank_), where.data(), where.size() * sizeof(uint64_t));
  barrier();
  for (int j = 0; j < size_; j++)
    if (meta(set, j)[1] == 0) return false;
  return true;
}

ShmGroup::ShmGroup(int rank, std::vector<int> ranks, void* base, size_t mappedBytes,
                   std::chrono::milliseconds timeout, int threads)
    : rank_(rank), size_(int(ranks.size())), ranks_(std::move(ranks)), base_(base), mappedBytes_(mappedBytes),
      timeout_(timeout), spin_(spinTime(size_ * std::max(1, threads))) {}

ShmGroup::~ShmGroup() { munmap(base_, mappedBytes_); }

int64_t* ShmGroup::meta(int set, int rank) const {
  return reinterpret_cast<int64_t*>(static_cast<char*>(base_) + kHeaderBytes +
                                    (size_t(set) * size_t(size_) + size_t(rank)) * kMetaLine);
}

char* ShmGroup::slot(int set, int rank) const {
  return static_cast<char*>(base_) + kHeaderBytes + metaBytes(size_) + tableBytes(size_) +
         (size_t(set) * size_t(size_) + size_t(rank)) * kExchangeSlotBytes;
}

void ShmGroup::barrier() {
  Header& h = *headerOf(base_);
  requireNotAborted();
  // read before arriving: the generation cannot move until this rank has arrived
  const uint32_t generation = h.generation.load(std::memory_order_acquire);
  if (h.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(size_)) {
    h.arrived.store(0, std::memory_order_relaxed);
    h.generation.fetch_add(1, std::memory_order_release);  // publishes the reset too
    futexWakeAll(h.generation);
    return;
  }
  // kSpins polls, then more for up to spin_, yielding the CPU between rounds of polls: the
  // rank it waits for may be queued on this CPU (the scheduler put both there), and would
  // otherwise wait out the whole spin. With the other rank elsewhere, a yield returns at once.
  const auto until = std::chrono::steady_clock::now() + spin_;
  do {
    for (int i = 0; i < kSpins; i++) {
      if (h.generation.load(std::memory_order_acquire) != generation) return;
      cpuRelax();
    }
    if (spin_.count() > 0) sched_yield();
  } while (spin_.count() > 0 && std::chrono::steady_clock::now() < until);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (h.generation.load(std::memory_order_acquire) == generation) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds(0))
      throw CommError(cat("timed out after ", timeout_.count() / 1000.0,
                          " s (--collective-timeout): a rank of the group did not take part"));
    futexWait(h.generation, generation, std::min<std::chrono::nanoseconds>(left, kMaxSleep));
    if (h.generation.load(std::memory_order_acquire) == generation) {
      requireNotAborted();
      requirePeers();
    }
  }
}

void ShmGroup::requirePeers() const {
  const Header& h = *headerOf(base_);
  for (int j = 0; j < size_; j++) {
    const int32_t pid = h.pids[j].load(std::memory_order_relaxed);
    if (j != rank_ && pid > 0 && kill(pid_t(pid), 0) != 0 && errno == ESRCH)
      throw PeerFailure(cat("rank ", ranks_[size_t(j)], " (process ", pid, ") exited"));
  }
}

void ShmGroup::requireNotAborted() const {
  Header& h = *headerOf(base_);
  uint32_t state = h.abortState.load(std::memory_order_acquire);
  if (state == kRunning) return;
  // the aborting rank is writing its reason: a few microseconds
  for (int i = 0; i < 100000 && state == kWriting; i++) {
    cpuRelax();
    state = h.abortState.load(std::memory_order_acquire);
  }
  if (state != kAborted) throw PeerFailure("a rank of the group aborted it");
  throw PeerFailure(std::string(h.abortReason, strnlen(h.abortReason, kReasonBytes)));
}

void ShmGroup::abort(const std::string& reason) noexcept {
  Header& h = *headerOf(base_);
  uint32_t expected = kRunning;
  if (h.abortState.compare_exchange_strong(expected, kWriting, std::memory_order_acq_rel)) {
    const size_t n = std::min(reason.size(), kReasonBytes - 1);
    std::memcpy(h.abortReason, reason.data(), n);
    h.abortReason[n] = 0;
    h.abortState.store(kAborted, std::memory_order_release);
  }
  // the waiters sleep on the generation, which does not move: they wake, see the word and throw
  futexWakeAll(h.generation);
}

template <typename T>
void ShmGroup::reduceChunk(T* data, int64_t n) {
  const int set = nextSet();
  std::memcpy(slot(set, rank_), data, size_t(n) * sizeof(T));
  barrier();
  // part `rank_` of every slot, summed in group order, into this rank's slot
  const auto [lo, hi] = partOf<T>(n, rank_, size_);
  std::vector<const T*> parts(static_cast<size_t>(size_), nullptr);
  for (int j = 0; j < size_; j++) parts[size_t(j)] = reinterpret_cast<const T*>(slot(set, j)) + lo;
  if (hi > lo) sumParts(reinterpret_cast<T*>(slot(set, rank_)) + lo, parts.data(), size_, hi - lo);
  barrier();
  for (int j = 0; j < size_; j++) {
    const auto [l, h] = partOf<T>(n, j, size_);
    if (h > l) std::memcpy(data + l, reinterpret_cast<const T*>(slot(set, j)) + l, size_t(h - l) * sizeof(T));
  }
}

// A round: rank j writes into lane k of its slot the round's piece of its block k (P − 1 lanes, one
// per other rank: lane k for k < j, k − 1 for k > j), a barrier, and rank r sums its lane of every
// other slot with its own piece, in group order.
template <typename T>
void ShmGroup::reduceScatterOf(const T* in, T* out, int64_t blockCount) {
  const int P = size_;
  if (direct()) {
    // block r of every rank's input, summed straight into out: in place (out is block r of in),
    // or apart from in
    const int64_t bytes = P * blockCount * int64_t(sizeof(T)), outBytes = blockCount * int64_t(sizeof(T));
    const bool apart = disjoint(in, bytes, out, outBytes) || out == in + rank_ * blockCount;
    const int set = nextSet();
    if (publish(set, blockCount == 0 || (shared(in, bytes) && apart), {uint64_t(reinterpret_cast<uintptr_t>(in))})) {
      std::vector<const T*> parts(static_cast<size_t>(P), nullptr);
      for (int j = 0; j < P && blockCount > 0; j++)
        parts[size_t(j)] = j == rank_ ? in + rank_ * blockCount
                                      : reinterpret_cast<const T*>(peerBytes(
                                            j, published(set, j)[0] + uint64_t(rank_ * outBytes), outBytes));
      if (blockCount > 0) sumParts(out, parts.data(), P, blockCount);
      barrier();  // every input is read
      return;
    }
  }
  const int64_t lane = int64_t(kSlotBytes) / (P - 1) / 64 * 64 / int64_t(sizeof(T));  // elements
  const auto laneOf = [](int k, int j) { return k < j ? k : k - 1; };  // rank k's lane in slot j
  std::vector<const T*> parts(static_cast<size_t>(P), nullptr);
  for (int64_t at = 0; at < blockCount; at += lane) {
    const int64_t n = std::min(lane, blockCount - at);
    const int set = nextSet();
    T* mine = reinterpret_cast<T*>(slot(set, rank_));
    for (int k = 0; k < P; k++)
      if (k != rank_) std::memcpy(mine + laneOf(k, rank_) * lane, in + k * blockCount + at, size_t(n) * sizeof(T));
    barrier();
    for (int j = 0; j < P; j++)
      parts[size_t(j)] = j == rank_ ? in + rank_ * blockCount + at
                                    : reinterpret_cast<const T*>(slot(set, j)) + laneOf(rank_, j) * lane;
    sumParts(out + at, parts.data(), P, n);
  }
}

void ShmGroup::reduceScatter(const void* in, void* out, DType dtype, int64_t blockCount) {
  switch (dtype) {
    case DType::f32: return reduceScatterOf(static_cast<const float*>(in), static_cast<float*>(out), blockCount);
    case DType::f64: return reduceScatterOf(static_cast<const double*>(in), static_cast<double*>(out), blockCount);
    case DType::bf16: return reduceScatterOf(static_cast<const bf16*>(in), static_cast<bf16*>(out), blockCount);
    case DType::i32:
      return reduceScatterOf(static_cast<const int32_t*>(in), static_cast<int32_t*>(out), blockCount);
    case DType::i64:
      return reduceScatterOf(static_cast<const int64_t*>(in), static_cast<int64_t*>(out), blockCount);
    default:
      throw CommError(cat("reduce-scatter of ", dtypeName(dtype), " is not supported (f32, f64, bf16, i32, i64)"));
  }
}

// Direct: rank r sums part r of every rank's data into its own, a barrier, each rank copies every
// other part from its owner, a barrier. The parts and the order of the sums are the slots' (partOf
// over the whole buffer instead of a chunk), so the bits are the same.
template <typename T>
void ShmGroup::allReduceOf(T* data, int64_t count) {
  if (direct()) {
    const int set = nextSet();
    const int64_t bytes = count * int64_t(sizeof(T));
    if (publish(set, count == 0 || shared(data, bytes), {uint64_t(reinterpret_cast<uintptr_t>(data))})) {
      const auto part = [&](int j) -> std::pair<int64_t, int64_t> { return partOf<T>(count, j, size_); };
      const auto of = [&](int j, int64_t lo, int64_t hi) {
        return reinterpret_cast<T*>(peerBytes(j, published(set, j)[0] + uint64_t(lo) * sizeof(T), (hi - lo) * int64_t(sizeof(T))));
      };
      const auto [lo, hi] = part(rank_);
      if (hi > lo) {
        std::vector<const T*> parts(static_cast<size_t>(size_), nullptr);
        for (int j = 0; j < size_; j++) parts[size_t(j)] = j == rank_ ? data + lo : of(j, lo, hi);
        sumParts(data + lo, parts.data(), size_, hi - lo);
      }
      barrier();  // every part is summed
      for (int j = 0; j < size_; j++) {
        const auto [l, h] = part(j);
        if (j != rank_ && h > l) copyBlock(data + l, of(j, l, h), size_t(h - l) * sizeof(T));
      }
      barrier();  // every part is read
      return;
    }
  }
  const int64_t perChunk = int64_t(kSlotBytes) / int64_t(sizeof(T));
  for (int64_t off = 0; off < count; off += perChunk) reduceChunk(data + off, std::min(perChunk, count - off));
}

void ShmGroup::allReduce(void* data, DType dtype, int64_t count) {
  switch (dtype) {
    case DType::f32: return allReduceOf(static_cast<float*>(data), count);
    case DType::f64: return allReduceOf(static_cast<double*>(data), count);
    case DType::bf16: return allReduceOf(static_cast<bf16*>(data), count);
    case DType::i32: return allReduceOf(static_cast<int32_t*>(data), count);
    case DType::i64: return allReduceOf(static_cast<int64_t*>(data), count);
    default: throw CommError(cat("all-reduce of ", dtypeName(dtype), " is not supported (f32, f64, bf16, i32, i64)"));
  }
}

void ShmGroup::allGather(const void* in, void* out, int64_t blockBytes) {
  char* o = static_cast<char*>(out);
  const char* x = static_cast<const char*>(in);
  if (o + rank_ * blockBytes != x) moveBlock(o + rank_ * blockBytes, x, size_t(blockBytes));
  if (direct()) {
    // in place (x is this rank's block of out), or apart from out
    const bool apart = disjoint(x, blockBytes, o, size_ * blockBytes) || x == o + rank_ * blockBytes;
    const int set = nextSet();
    if (publish(set, blockBytes == 0 || (shared(x, blockBytes) && apart), {uint64_t(reinterpret_cast<uintptr_t>(x))})) {
      for (int j = 0; j < size_ && blockBytes > 0; j++)
        if (j != rank_) copyBlock(o + j * blockBytes, peerBytes(j, published(set, j)[0], blockBytes), size_t(blockBytes));
      barrier();  // every block is read
      return;
    }
  }
  const int64_t S = int64_t(kSlotBytes);
  for (int64_t at = 0; at < blockBytes; at += S) {
    const int64_t n = std::min(S, blockBytes - at);
    const int set = nextSet();
    std::memcpy(slot(set, rank_), x + at, size_t(n));
    barrier();
    for (int j = 0; j < size_; j++)
      if (j != rank_) std::memcpy(o + j * blockBytes + at, slot(set, j), size_t(n));
  }
}

void ShmGroup::broadcast(void* data, int64_t bytes, int root) {
  char* d = static_cast<char*>(data);
  if (direct()) {
    const int set = nextSet();
    if (publish(set, rank_ != root || bytes == 0 || shared(d, bytes), {uint64_t(reinterpret_cast<uintptr_t>(d))})) {
      if (rank_ != root && bytes > 0) copyBlock(d, peerBytes(root, published(set, root)[0], bytes), size_t(bytes));
      barrier();  // the root's data is read
      return;
    }
  }
  const int64_t S = int64_t(kSlotBytes);
  for (int64_t at = 0; at < bytes; at += S) {
    const int64_t n = std::min(S, bytes - at);
    const int set = nextSet();
    if (rank_ == root) std::memcpy(slot(set, root), d + at, size_t(n));
    barrier();
    if (rank_ != root) std::memcpy(d + at, slot(set, root), size_t(n));
  }
}

void ShmGroup::allToAllV(const void* in, const std::vector<int64_t>& sendBytes, void* out,
                         const std::vector<int64_t>& recvBytes) {
  const int P = size_;
  if (int(sendBytes.size()) != P || int(recvBytes.size()) != P)
    throw CommError(cat("all-to-all over ", P, " ranks with ", sendBytes.size(), " send and ", recvBytes.size(),
                        " receive sizes"));
  if (sendBytes[size_t(rank_)] != recvBytes[size_t(rank_)])
    throw CommError(cat("all-to-all: this rank sends itself ", sendBytes[size_t(rank_)], " bytes but expects ",
                        recvBytes[size_t(rank_)]));
  const char* x = static_cast<const char*>(in);
  char* y = static_cast<char*>(out);
  std::vector<int64_t> sendAt(size_t(P) + 1, 0), recvAt(size_t(P) + 1, 0);
  for (int j = 0; j < P; j++) {
    sendAt[size_t(j) + 1] = sendAt[size_t(j)] + sendBytes[size_t(j)];
    recvAt[size_t(j) + 1] = recvAt[size_t(j)] + recvBytes[size_t(j)];
  }
  if (sendBytes[size_t(rank_)] > 0)
    moveBlock(y + recvAt[size_t(rank_)], x + sendAt[size_t(rank_)], size_t(sendBytes[size_t(rank_)]));
  if (direct()) {
    // in place, unless this rank's output overlaps its input (its own writes would meet the reads)
    const int64_t sent = sendAt[size_t(P)], received = recvAt[size_t(P)];
    const bool ok = sent == 0 || (shared(x, sent) && disjoint(x, sent, y, received));
    std::vector<uint64_t> where(static_cast<size_t>(P));
    for (int j = 0; j < P; j++) where[size_t(j)] = uint64_t(reinterpret_cast<uintptr_t>(x + sendAt[size_t(j)]));
    const int set = nextSet();
    if (publish(set, ok, where)) {
      for (int i = 0; i < P; i++) {
        const int64_t n = recvBytes[size_t(i)];
        if (i != rank_ && n > 0) copyBlock(y + recvAt[size_t(i)], peerBytes(i, published(set, i)[rank_], n), size_t(n));
      }
      barrier();  // the senders' inputs are read
      return;
    }
  }
  // a slot is P lanes, lane j carrying this round's piece of the block to rank j
  const int64_t lane = int64_t(kExchangeSlotBytes) / P / 64 * 64;
  int64_t mine = 0;
  for (int j = 0; j < P; j++)
    if (j != rank_) mine = std::max({mine, (sendBytes[size_t(j)] + lane - 1) / lane, (recvBytes[size_t(j)] + lane - 1) / lane});
  int64_t rounds = 1;
  for (int64_t k = 0; k < rounds; k++) {
    const int set = nextSet();
    if (k == 0) *meta(set, rank_) = mine;
    const int64_t at = k * lane;
    for (int j = 0; j < P; j++) {
      const int64_t n = std::min(lane, sendBytes[size_t(j)] - at);
      if (j != rank_ && n > 0) std::memcpy(slot(set, rank_) + j * lane, x + sendAt[size_t(j)] + at, size_t(n));
    }
    barrier();
    if (k == 0)
      for (int i = 0; i < P; i++) rounds = std::max(rounds, *meta(set, i));
    for (int i = 0; i < P; i++) {
      const int64_t n = std::min(lane, recvBytes[size_t(i)] - at);
      if (i != rank_ && n > 0) std::memcpy(y + recvAt[size_t(i)] + at, slot(set, i) + rank_ * lane, size_t(n));
    }
  }
}

// Each sender copies a whole slot a round into its own slot, the root copies every sender's out:
// one barrier per slot of the largest block (an allToAllV would give each a lane, 1/P slot)
void ShmGroup::gatherV(const void* in, void* out, const std::vector<int64_t>& blockBytes, int root) {
  const int P = size_;
  if (int(blockBytes.size()) != P || root < 0 || root >= P)
    throw CommError(cat("gather over ", P, " ranks with ", blockBytes.size(), " block sizes to root ", root));
  const char* x = static_cast<const char*>(in);
  char* y = static_cast<char*>(out);
  std::vector<int64_t> at(size_t(P) + 1, 0);
  for (int i = 0; i < P; i++) at[size_t(i) + 1] = at[size_t(i)] + blockBytes[size_t(i)];
  const int64_t own = blockBytes[size_t(root)];
  if (direct()) {
    // the senders write their blocks into the root's output, all at once, while the root moves
    // its own: the root's input must not overlap the others' blocks
    bool ok = true;
    if (rank_ == root) {
      const char* mine = y + at[size_t(root)];
      const bool apart = disjoint(x, own, y, at[size_t(P)]) || x == mine;
      ok = at[size_t(P)] == own || (shared(y, at[size_t(P)]) && (apart || own == 0));
    }
    const int set = nextSet();
    if (publish(set, ok, {uint64_t(reinterpret_cast<uintptr_t>(y))})) {
      const int64_t n = blockBytes[size_t(rank_)];
      if (rank_ == root && own > 0 && x != y + at[size_t(root)]) moveBlock(y + at[size_t(root)], x, size_t(own));
      if (rank_ != root && n > 0)
        copyBlock(peerBytes(root, published(set, root)[0] + uint64_t(at[size_t(rank_)]), n), x, size_t(n));
      barrier();  // every block is written
      return;
    }
  }
  if (rank_ == root && own > 0) moveBlock(y + at[size_t(root)], x, size_t(own));
  const int64_t S = int64_t(kExchangeSlotBytes);
  int64_t rounds = 0;
  for (int i = 0; i < P; i++)
    if (i != root) rounds = std::max(rounds, (blockBytes[size_t(i)] + S - 1) / S);
  for (int64_t k = 0; k < rounds; k++) {
    const int set = nextSet();
    const int64_t off = k * S;
    if (rank_ != root) {
      const int64_t n = std::min(S, blockBytes[size_t(rank_)] - off);
      if (n > 0) std::memcpy(slot(set, rank_), x + off, size_t(n));
    }
    barrier();
    if (rank_ == root)
      for (int i = 0; i < P; i++) {
        const int64_t n = std::min(S, blockBytes[size_t(i)] - off);
        if (i != root && n > 0) std::memcpy(y + at[size_t(i)] + off, slot(set, i), size_t(n));
      }
  }
}

}  // namespace lfc::comm
