// Dims of plan buffers: a number, or a rational multiple of one symbol (`S`, `4*Nv`, `Np/4`),
// as ir/shape.ts writes them. The symbols a microbatch defines are listed once here.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace lfc {

// Symbols resolved per microbatch from its data: S = tokens, Nv = visual tokens
// (patches / merge²). A plan dim over any other symbol is refused at load.
enum Symbol : int { kSymS, kSymNv, kSymbolCount };
inline constexpr const char* kSymbolNames[] = {"S", "Nv"};

struct Dim {
  int64_t value = 0;  // the number when sym < 0
  int sym = -1;       // Symbol, or −1 for a number
  int64_t num = 1;    // value = floor(size(sym) · num / den)
  int64_t den = 1;
  bool symbolic() const { return sym >= 0; }
};

using SymbolSizes = std::array<int64_t, kSymbolCount>;

// Parses "12", "S", "4*Nv", "Nv/2", "2*S/3"; throws std::invalid_argument naming the text.
Dim parseDim(const std::string& text);
std::string formatDim(const Dim& d);
std::string formatShape(const std::vector<Dim>& s);
std::string formatShape(const std::vector<int64_t>& s);

inline int64_t resolveDim(const Dim& d, const SymbolSizes& sizes) {
  return d.sym < 0 ? d.value : sizes[d.sym] * d.num / d.den;
}

std::vector<int64_t> resolveShape(const std::vector<Dim>& s, const SymbolSizes& sizes);
int64_t numel(const std::vector<int64_t>& s);

}  // namespace lfc
