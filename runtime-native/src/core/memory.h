// The runtime's memory: one 64-byte-aligned, zero-initialized block per region (sizes from the
// program's `regions`), and for the data region one block per microbatch slot (data buffer offsets
// are within their slot's block). Shared by the runtime and the ArrayBuffers handed to JS, so the
// bytes outlive whichever goes last.
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

 private:
  std::byte* data_ = nullptr;
  int64_t size_ = 0;
};

class Memory {
 public:
  explicit Memory(const Program& p);
  // start of a region (slot: the microbatch slot, for the data region only)
  std::byte* region(Region r, int slot = 0) const;
  int64_t regionSize(Region r) const;
  // first byte of a buffer (a view resolves to the bytes of the buffer it shares)
  std::byte* buffer(const Program& p, int id) const;

 private:
  std::array<std::unique_ptr<Block>, kRegionCount> regions_;
  std::vector<std::unique_ptr<Block>> dataSlots_;
};

}  // namespace lfc
