// The runtime's memory: one 64-byte-aligned, zero-initialized block per region, of exactly the
// program's `regions` bytes (the data region's microbatch slots lie side by side in one block, at
// their buffers' offsets; the scratch region holds each stream's slice, program.scratchBytes).
// Shared by the runtime and the ArrayBuffers handed to JS, so the bytes outlive whichever goes
// last.
//
// A block is a memfd mapped shared where the kernel allows (else plain aligned memory), so that
// the other ranks of a shared-memory group can map it and read a collective's input in place
// (comm/shm.h): the runtime hands each block's fd to its communicators when it connects.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/program.h"

namespace lfc {

class Block {
 public:
  explicit Block(int64_t bytes);
  ~Block();
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  std::byte* data() const { return data_; }
  int64_t size() const { return size_; }
  // the memfd behind it, or -1 when it is plain memory (or empty)
  int fd() const { return fd_; }

 private:
  std::byte* data_ = nullptr;
  int64_t size_ = 0;
  int fd_ = -1;
};

class Memory {
 public:
  explicit Memory(const Program& p);
  // start of a region
  std::byte* region(Region r) const;
  int64_t regionSize(Region r) const;
  // a stream's slice of the scratch region
  std::byte* scratch(const Program& p, int stream) const;
  // every region's bytes: what this memory holds
  int64_t totalBytes() const;
  const Block& block(Region r) const { return *regions_[size_t(r)]; }
  // first byte of a buffer (a view resolves to the bytes of the buffer it shares)
  std::byte* buffer(const Program& p, int id) const;

 private:
  std::array<std::unique_ptr<Block>, kRegionCount> regions_;
};

}  // namespace lfc
