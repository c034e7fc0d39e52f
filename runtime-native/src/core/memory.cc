#include "core/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"

namespace lfc {

constexpr int64_t kAlign = 64;

// what a block of `bytes` allocates: whole 64-byte lines, at least one
static int64_t roundedBytes(int64_t bytes) { return std::max<int64_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign); }

Block::Block(int64_t bytes) : size_(bytes) {
  const int64_t rounded = roundedBytes(bytes);
  // a memfd's pages are zero until written, and mmap aligns to a page (an empty region needs none)
  const int fd = bytes > 0 ? memfd_create("lfc-region", MFD_CLOEXEC) : -1;
  if (fd >= 0 && ftruncate(fd, off_t(rounded)) == 0) {
    void* p = mmap(nullptr, size_t(rounded), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      data_ = static_cast<std::byte*>(p);
      fd_ = fd;
      return;
    }
  }
  if (fd >= 0) close(fd);
  data_ = static_cast<std::byte*>(std::aligned_alloc(size_t(kAlign), size_t(rounded)));
  if (!data_) throw RuntimeError(cat("cannot allocate ", bytes, " bytes"));
  std::memset(data_, 0, size_t(rounded));
}

Block::~Block() {
  if (fd_ < 0) {
    std::free(data_);
    return;
  }
  munmap(data_, size_t(roundedBytes(size_)));
  close(fd_);
}

Memory::Memory(const Program& p) {
  for (int r = 0; r < kRegionCount; r++) regions_[size_t(r)] = std::make_unique<Block>(p.regionBytes[size_t(r)]);
}

std::byte* Memory::region(Region r) const { return regions_[size_t(r)]->data(); }

int64_t Memory::regionSize(Region r) const { return regions_[size_t(r)]->size(); }

std::byte* Memory::scratch(const Program& p, int stream) const {
  int64_t offset = 0;
  for (int s = 0; s < stream; s++) offset += p.scratchBytes[size_t(s)];
  return region(Region::scratch) + offset;
}

int64_t Memory::totalBytes() const {
  int64_t total = 0;
  for (const auto& b : regions_) total += b->size();
  return total;
}

std::byte* Memory::buffer(const Program& p, int id) const {
  const Buffer& b = p.buffers[size_t(p.buffers[size_t(id)].root)];
  return region(b.region) + b.offset;
}

}  // namespace lfc
