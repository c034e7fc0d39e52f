// Collectives through shared memory, for a group whose ranks share one machine.
//
// Over loopback TCP every byte is copied into the kernel and out again on each hop, with a system
// call or two per message, and the ranks take turns on the cores to do it; OpenMPI and NCCL move
// data between processes of one machine through shared memory instead (OpenMPI's vader, NCCL's
// SHM transport). This is that path for lfc's Gloo backend: one mapping per communicator, holding
// two sets of P slots (one per rank, kExchangeSlotBytes each). Every collective runs in rounds, and a
// round is: each rank writes its piece into its own slot of the round's set, a barrier, each rank
// reads what it needs from the others' slots. Rounds alternate between the two sets, so a round's
// writes never meet the previous round's reads: they go to the other set, and the set after waits
// for a barrier every rank reaches only after its reads.
//
//   all_reduce   a chunk of one slot per round, in two halves: copy in, barrier, rank r sums part r
//                of every slot in group order into its own slot, barrier, copy every part out.
//                Every element is summed once in one fixed order, so every rank gets the same bits;
//                bf16 is summed in f32 and rounded once, when its part is written back
//   reduce_scatter a slot is P − 1 lanes, one per other rank k, carrying this round's piece of the
//                rank's block k; rank r sums its lane of every slot (its own piece straight from
//                its data) in group order into its block. Each rank writes and reads (P−1)/P of
//                the data once, against the all-reduce's copy in, sum and copy out of all of it
//   all_gather   each rank's block, kSlotBytes of it per round
//   broadcast    the root's data, kSlotBytes of it per round
//   all_to_all_v a slot is P lanes, one per destination; a round moves a lane's worth of every
//                block. Each rank knows only its own sizes, so the first round also carries each
//                rank's count of rounds, and all run the largest
//
// Direct reads and writes. The runtime's regions are memfds (core/memory.h), and at setup each
// member maps the others' (one mapping per peer region per process, whatever the groups), found
// as /proc/PID/fd/FD and checked by device and inode. Where every member's buffers lie in them,
// a collective skips the slots: each rank publishes in its slot where its buffer lies, a barrier,
// then
//   all_reduce     rank r sums part r of every rank's buffer (the slots' parts and order, so the
//                  same bits) into its own, a barrier, each copies every other part from its owner
//   reduce_scatter rank r sums block r of every rank's input straight into its output
//   all_gather, broadcast, all_to_all_v   each reader copies its blocks from the senders' buffers
//   gather_v       each sender writes its block into the root's output, all at once, while the
//                  root moves its own
// and a barrier, after which the buffers may change. Each byte is copied once, with two or three
// barriers a collective, against the slots' two copies and a barrier a round; copies stream past
// the cache (copy.h). Where some member's buffer lies elsewhere (a count on the stack, an output
// that overlaps its input) every member takes the slots, after that first barrier. OpenMPI copies
// once too for large messages, through the kernel (cross-memory attach), which on this kind of
// machine is slower than memcpy (docs/benchmarks.md). LFC_COMM_DIRECT=0 turns direct reads off.
//
// Rounds are small (kSlotBytes) so a round's data is still in cache when it is read: at 64 MiB on
// 2 cores, all-reduce slots of 256 KiB took 52 ms against 92 ms with 8 MiB slots. The direct
// exchanges move more a round (kExchangeSlotBytes): each of their rounds is a barrier for a 1/P
// lane of every block, and over 256 KiB slots a 64 MiB all_to_all_v on 2 ranks was bound by its
// barriers (26-29 ms, against 16-18 ms with 1 MiB slots, bench/collectives, two runs each,
// alternated, on a 2-core EPYC; gather_v 15-16 ms against 9-11 ms). The barriers are
// a counter and a generation in the mapping, waited on with a futex and the collective timeout; a
// rank that waits checks every 100 ms that its peers' processes still exist, so a member that dies
// fails the others at once, as a closed TCP connection would. The mapping also holds an abort word
// and its reason (abort): a rank whose step fails sets it and wakes the waiters, which throw
// PeerFailure with that reason; a set word fails every later barrier too. Rounds then stop midway
// (a barrier's count stays raised), so an aborted group is never used again.
//
// Setup is collective over the group's Gloo communicator: the ranks compare a host key (hostname,
// boot id and process id namespace, so that a peer's process id means the same process to all);
// if all match, rank 0 creates the mapping with a nonce, the others open it and
// check the nonce, and all agree before using it, so ranks on different machines, or in containers
// with separate /dev/shm, stay on Gloo together. The name is unlinked once every rank holds it:
// nothing is left behind in /dev/shm.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "core/dtype.h"

namespace lfc::comm {

class ShmGroup {
 public:
  // bytes of one rank's slot in one set, and what a round of the direct exchanges (all_to_all_v,
  // gather_v) moves through it
  static constexpr size_t kExchangeSlotBytes = size_t(1) << 20;
  // what a round of the others moves through a slot: all_reduce's chunk, reduce_scatter's lanes,
  // all_gather's and broadcast's pieces
  static constexpr size_t kSlotBytes = size_t(256) << 10;

  // what setup needs of the group's other transport
  struct Exchange {
    std::function<void(void*, size_t)> broadcast;  // bytes from group rank 0 to every rank
    std::function<void(int32_t*)> sum;             // one integer summed over the group
  };
  // Collective: the group's shared mapping, or null on every member when some member cannot share
  // it or is not `allowed` to.
  // ranks: the global rank of each group rank (errors name them).
  // shared: this rank's memory that peers may map for direct reads (none: the slots alone).
  // threads: each rank's computing threads (0: unknown), which decide how long a barrier polls.
  static std::unique_ptr<ShmGroup> connect(int rank, const std::vector<int>& ranks, bool allowed,
                                           std::chrono::milliseconds timeout, const Exchange& exchange,
                                           const std::vector<SharedRange>& shared = {}, int threads = 0);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // The Communicator primitives (comm.h), same contracts.
  void allReduce(void* data, DType dtype, int64_t count);
  void reduceScatter(const void* in, void* out, DType dtype, int64_t blockCount);
  void allGather(const void* in, void* out, int64_t blockBytes);
  void broadcast(void* data, int64_t bytes, int root);
  void allToAllV(const void* in, const std::vector<int64_t>& sendBytes, void* out,
                 const std::vector<int64_t>& recvBytes);
  void gatherV(const void* in, void* out, const std::vector<int64_t>& blockBytes, int root);
  // Fails every member's barrier, now and from now on, with `reason` (the first one set stays);
  // wakes those asleep. Any thread, never throws.
  void abort(const std::string& reason) noexcept;
  // whether every member mapped every other's shared memory at setup (direct reads)
  bool direct() const { return !peers_.empty(); }

  struct PeerMapping;  // a peer's region mapped here, shared by the groups that read it

 private:
  struct PeerRange {
    uint64_t base;  // where it lies in the peer's process
    int64_t bytes;
    std::shared_ptr<const PeerMapping> map;
  };
  ShmGroup(int rank, std::vector<int> ranks, void* base, size_t mappedBytes, std::chrono::milliseconds timeout,
           int threads);
  int nextSet() { return int(rounds_++ % 2); }
  char* slot(int set, int rank) const;
  int64_t* meta(int set, int rank) const;  // one value per rank and set, beside the slots
  void barrier();
  void requirePeers() const;  // throws PeerFailure when a member's process is gone
  void requireNotAborted() const;  // throws PeerFailure when a member aborted the group
  // whether [p, p + n) lies in one of this rank's shared ranges
  bool shared(const void* p, int64_t n) const;
  // peer j's bytes [at, at + n) of its own address space, mapped here; throws CommError when they
  // are not in one of its shared ranges
  char* peerBytes(int j, uint64_t at, int64_t n) const;
  // Direct reads' first step, on a fresh set: this rank says whether its input qualifies (`ok`)
  // and writes `where` (its blocks' addresses) into its slot; a barrier; true when every member's
  // does. False leaves the set's slots to be overwritten by the slots' rounds.
  bool publish(int set, bool ok, const std::vector<uint64_t>& where);
  const uint64_t* published(int set, int j) const { return reinterpret_cast<const uint64_t*>(slot(set, j)); }
  void mapPeers(const std::vector<SharedRange>& shared, const Exchange& exchange);
  template <typename T>
  void allReduceOf(T* data, int64_t count);
  template <typename T>
  void reduceChunk(T* data, int64_t count);
  template <typename T>
  void reduceScatterOf(const T* in, T* out, int64_t blockCount);

  int rank_, size_;
  std::vector<int> ranks_;  // global rank of each group rank
  void* base_;
  size_t mappedBytes_;
  std::chrono::milliseconds timeout_;
  std::chrono::nanoseconds spin_;  // how long a barrier polls past kSpins before it sleeps
  uint64_t rounds_ = 0;  // rounds run so far: the next one's set is rounds_ % 2
  std::vector<SharedRange> own_;                // this rank's shared memory
  std::vector<std::vector<PeerRange>> peers_;   // per group rank: its shared memory (empty: no direct reads)
};

// Whether communicators try shared memory at all: LFC_COMM_SHM=0 turns it off (Gloo over TCP only).
bool shmAllowed();

}  // namespace lfc::comm
