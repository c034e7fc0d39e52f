// The collective backend: what the collective instructions of a plan (all_reduce … recv) run on.
//
// A Communicator is one group of the plan on one stream: a few blocking primitives over byte
// buffers (sum all-reduce, sum reduce-scatter of equal blocks, equal-block all-gather, broadcast,
// all-to-all of variable blocks, point-to-point send/recv). The collective ops (collectives.cc)
// build the plan's semantics from them, so a second backend (NCCL) only implements this
// interface. A Backend holds one
// Communicator per (group, stream) this rank takes part in, so the comm stream runs beside the
// compute stream without sharing a connection, plus one over every rank (the control
// communicator) that the training loop uses between steps.
//
// Every primitive blocks until done, or throws CommError after the backend's timeout (the
// collective timeout of `lfc run`), so a missing rank turns into an error rather than a hang.
//
// Failures: a rank whose step fails aborts its backend (Backend::abort) before it throws. Every
// communicator it holds then fails its members within a fraction of a second, wherever they wait:
// shared memory through an abort word its barrier checks, TCP through the closed connections,
// with the reason in the run's store (the key `prefix/abort`), so that the failure travels
// through the communicators and the store, not through a launcher. A member that learns of it
// throws PeerFailure with the same reason and aborts its own backend in turn, so a failure
// reaches every rank of the job however its groups overlap; a member whose process is gone (a
// dead pid on shared memory, a connection closed without a reason on TCP) is a PeerFailure too.
// An aborted backend stays broken: its runtime refuses further steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "generated/schema.h"

namespace lfc::comm {

struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Another rank failed (its own check, or its process ended): `reason` names it and its check,
// alike on every rank that learns of it, so each passes the same cause on (Backend::abort).
struct PeerFailure : CommError {
  explicit PeerFailure(const std::string& reason) : CommError(reason), reason(reason) {}
  std::string reason;
};

// The stream index of the control communicator (after schema::kStreams).
constexpr int kControlStream = int(sizeof(schema::kStreams) / sizeof(schema::kStreams[0]));
// The group index of the world (every rank, in rank order), for the control communicator.
constexpr int kWorldGroup = -1;

struct GroupSpec {
  std::string name;        // plan.groups[i].name, e.g. "dp[0]"
  std::vector<int> ranks;  // group rank j is global rank ranks[j]
};

// A communicator to open: a group (index into groups, or kWorldGroup) on a stream.
struct ContextSpec {
  int group = kWorldGroup;
  int stream = kControlStream;
  bool operator<(const ContextSpec& o) const {
    return group != o.group ? group < o.group : stream < o.stream;
  }
};

// A range of this rank's memory that the members of a shared-memory group may map and read
// directly (the runtime's regions, each a memfd: core/memory.h). A collective whose input lies in
// one is read by its peers straight from it, one copy instead of two through the group's slots.
struct SharedRange {
  const void* base = nullptr;
  int64_t bytes = 0;
  int fd = -1;  // open in this process while it runs; peers open it as /proc/PID/fd/FD
};

// One rank's view of the job, from plan.json and the launcher.
struct Config {
  int rank = 0;
  int worldSize = 1;
  // where the ranks meet: "tcp:HOST:PORT" (the launcher's store) or "file:DIR" (one machine)
  std::string store;
  std::string prefix;              // store keys of this run start with it
  std::string host = "127.0.0.1";  // the address this rank's connections listen on
  std::vector<GroupSpec> groups;
  std::map<std::string, std::vector<int>> rankGroups;  // kind → each rank's group index
  // communicators to open: every (group, stream) that some rank's collectives use, so that all
  // members of a group open the same ones (ranks outside a group skip it)
  std::vector<ContextSpec> contexts;
  std::chrono::milliseconds timeout{300'000};
  std::vector<SharedRange> shared;  // filled by the runtime (Runtime::connect), not the launcher
  int threads = 0;                  // each rank's computing threads (ibid.; 0: unknown)
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // in the group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;
  // how its collectives move data: "local" (one rank), "tcp" (Gloo), "shared memory" (shm.h;
  // decided when the communicator opens; send/recv stay on TCP)
  virtual std::string transport() const = 0;
  // whether its shared memory reads peers' inputs in place (ShmGroup::direct)
  virtual bool direct() const { return false; }

  // data[0:count] ← sum over the group (f32, f64, bf16, i32, i64; bf16 summed in f32 and rounded to
  // nearest even once per element: the shared-memory path sums bf16 slots in f32, Gloo over TCP
  // all-reduces an f32 copy). key ≥ 0 names the call the same way on
  // every member (the instruction's ordinal on its group and stream), so a backend may keep state
  // per call (buffers bound to algorithms) and every member decides alike whether it has some;
  // -1: no such name (the data's address may change from call to call)
  virtual void allReduce(void* data, DType dtype, int64_t count, int64_t key = -1) = 0;
  // in[0 : P·blockCount] is P consecutive blocks; out[0 : blockCount] ← Σ over the group of block r,
  // r this rank's group rank (same dtypes as allReduce). Every backend sums a block's P
  // contributions in group order, rank 0 first, with comm/sum.h's sumParts (bf16 in f32, rounded
  // once per element), so the bits are the same on every run and over every transport, and equal
  // the shared-memory allReduce's block r. out may be in + r·blockCount (in place); otherwise
  // in is left as it was. Each rank moves about (P−1)/P of `in`, half an all-reduce's traffic
  virtual void reduceScatter(const void* in, void* out, DType dtype, int64_t blockCount) = 0;
  // out ← every rank's `in` (blockBytes each) concatenated in group order
  virtual void allGather(const void* in, void* out, int64_t blockBytes) = 0;
  // data ← root's data
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  // block j of `in` (sendBytes[j], consecutive) goes to rank j; block i of `out`
  // (recvBytes[i], consecutive) comes from rank i; sizes must match pairwise
  virtual void allToAllV(const void* in, const std::vector<int64_t>& sendBytes, void* out,
                         const std::vector<int64_t>& recvBytes) = 0;
  // out on root ← every rank's `in` (blockBytes[i] from rank i; every member passes the same
  // list) concatenated in group order; out is unused elsewhere. The default is an allToAllV that
  // sends to root alone; shared memory gives each sender a whole slot a round instead of a lane
  virtual void gatherV(const void* in, void* out, const std::vector<int64_t>& blockBytes, int root) {
    std::vector<int64_t> send(blockBytes.size(), 0), recv(blockBytes.size(), 0);
    send.at(size_t(root)) = blockBytes.at(size_t(rank()));
    if (rank() == root) recv = blockBytes;
    allToAllV(in, send, out, recv);
  }
  virtual void send(const void* data, int64_t bytes, int peer, uint32_t tag) = 0;
  virtual void recv(void* data, int64_t bytes, int peer, uint32_t tag) = 0;
  // a batched send/recv (Megatron's batch_isend_irecv): post now, complete in waitPosted, which
  // the last instruction of the batch calls; buffers stay untouched until then
  virtual void postSend(const void* data, int64_t bytes, int peer, uint32_t tag) = 0;
  virtual void postRecv(void* data, int64_t bytes, int peer, uint32_t tag) = 0;
  virtual void waitPosted() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const Config& config() const = 0;
  // the communicator of group index `group` on `stream`; throws CommError when it was not opened
  virtual Communicator& at(int group, int stream) = 0;
  // every communicator this rank holds
  virtual std::vector<const Communicator*> communicators() const = 0;
  // This rank's step failed: tells every member of every communicator (`reason` names the rank
  // that failed first and its check), and wakes this rank's own threads blocked in them, which
  // throw PeerFailure. Safe from any thread, more than once (the first reason stays); never
  // throws. The backend is broken from then on.
  virtual void abort(const std::string& reason) noexcept = 0;
  // why the backend is broken ("" while it is not)
  virtual std::string broken() const = 0;
};

// Opens every communicator of the config this rank belongs to (blocks until all members
// arrived, or throws CommError after the timeout). Gloo over TCP.
std::unique_ptr<Backend> connectGloo(const Config& config);

// The group index of a group kind for this rank; throws CommError naming the kind.
int groupOf(const Config& config, const std::string& kind);

}  // namespace lfc::comm
