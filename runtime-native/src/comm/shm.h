// An all-reduce through shared memory, for a group whose ranks share one machine.
//
// Over loopback TCP every byte of an all-reduce is copied into the kernel and out again on each
// of its 2(P−1)/P hops, and the ranks take turns on the cores to do it; OpenMPI and NCCL move
// data between processes of one machine through shared memory instead (OpenMPI's vader, NCCL's
// SHM transport). This is that path for lfc's Gloo backend: one mapping per communicator, holding
// two sets of P slots (one per rank). A call runs in chunks of one slot:
//
//   copy in     each rank copies its chunk into its slot of the chunk's set
//   barrier
//   reduce      rank r sums part r of every slot, in group order, into part r of its own slot
//   barrier
//   copy out    each rank copies every part from the slot that reduced it
//
// so every element is summed once, in one fixed order, and every rank gets the same bits. Chunks
// alternate between the two sets, so the next chunk's copy-in never meets this chunk's copy-out
// (it waits for a barrier every rank reaches only after that copy-out). The barriers are a counter
// and a generation in the mapping, waited on with a futex and the collective timeout.
//
// Setup is collective over the group's Gloo communicator: rank 0 creates the mapping with a nonce,
// the others open it and check the nonce, and all agree (an all-reduce) before using it, so ranks
// on different machines or in containers with separate /dev/shm fall back to Gloo together. The
// name is unlinked once every rank holds it: nothing is left behind in /dev/shm.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "comm/comm.h"
#include "core/dtype.h"

namespace lfc::comm {

class ShmAllReduce {
 public:
  // what setup needs of the group's other transport
  struct Exchange {
    std::function<void(void*, size_t)> broadcast;  // bytes from group rank 0 to every rank
    std::function<void(int32_t*)> sum;             // one integer summed over the group
  };
  // Collective (every member calls it with the same slotBytes): a shared mapping with slots of
  // slotBytes, or null on every member when some member cannot share it or is not `allowed` to.
  static std::unique_ptr<ShmAllReduce> connect(int rank, int size, size_t slotBytes, bool allowed,
                                               std::chrono::milliseconds timeout, const Exchange& exchange);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  size_t slotBytes() const { return slotBytes_; }
  // data[0:count] ← sum over the group (f32, f64, i32, i64); collective
  void run(void* data, DType dtype, int64_t count);

 private:
  ShmAllReduce(int rank, int size, void* base, size_t mappedBytes, size_t slotBytes,
               std::chrono::milliseconds timeout);
  char* slot(int set, int rank) const;
  void barrier();
  template <typename T>
  void chunk(T* data, int64_t count);

  int rank_, size_;
  void* base_;
  size_t mappedBytes_, slotBytes_;
  std::chrono::milliseconds timeout_;
  uint64_t chunks_ = 0;  // chunks run so far: the next one's set is chunks_ % 2
};

// Whether communicators try shared memory at all: LFC_COMM_SHM=0 turns it off (Gloo over TCP only).
bool shmAllowed();

}  // namespace lfc::comm
