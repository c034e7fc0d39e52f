// Dims of plan buffers: a number, or a rational multiple of one symbol (`S`, `4*Nv`, `Np/4`,
// `Rx0`), as ir/shape.ts writes them. The symbols a program may name are listed here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lfc {

// Symbols. S (tokens) and Nv (visual tokens: patches / merge²) are data symbols, resolved per
// microbatch from its data before the step. Every other symbol is a run-time symbol, declared by
// the plan with a bound (plan.json `symbols`): the plan's buffers are planned at that bound, the
// step starts with it at its bound, and a variable-size collective (all_to_all_v, gather_v,
// scatter_v) that writes a buffer whose dim 0 is that symbol sets it, for that microbatch, to the
// rows it received (the rows an expert dispatch receives, `Rx<i>`). A plan dim over an undeclared
// symbol is refused at load.
enum Symbol : int { kSymS, kSymNv, kDataSymbolCount };

// Values of every symbol of a table, by index (one microbatch's sizes).
using SymbolSizes = std::vector<int64_t>;

struct SymbolDecl {
  std::string name;
  int64_t bound = -1;  // run-time symbols: their bound; data symbols: −1 (from the data)
};

class SymbolTable {
 public:
  SymbolTable();  // the data symbols only
  // Declares a run-time symbol; a data symbol's name is ignored (S and Nv come from the data).
  // Throws std::invalid_argument for a bad name or bound, or a name declared with another bound.
  void declare(const std::string& name, int64_t bound);
  int find(const std::string& name) const;  // −1 when absent
  int size() const { return int(decls_.size()); }
  const SymbolDecl& at(int s) const { return decls_[size_t(s)]; }
  static bool runTime(int s) { return s >= kDataSymbolCount; }
  // data symbols 0, run-time symbols at their bounds
  SymbolSizes atBounds() const;
  std::string names() const;  // "S, Nv, Rx0, …"

 private:
  std::vector<SymbolDecl> decls_;
};

struct Dim {
  int64_t value = 0;  // the number when sym < 0
  int sym = -1;       // index into the program's SymbolTable, or −1 for a number
  int64_t num = 1;    // value = floor(size(sym) · num / den)
  int64_t den = 1;
  std::string name;  // the symbol's name (for messages)
  bool symbolic() const { return sym >= 0; }
  bool bareSymbol() const { return sym >= 0 && num == 1 && den == 1; }
};

// Parses "12", "S", "4*Nv", "Nv/2", "2*S/3", "Rx0" against the symbols of `table`; throws
// std::invalid_argument naming the text.
Dim parseDim(const std::string& text, const SymbolTable& table);
// The data symbols only (S, Nv).
Dim parseDim(const std::string& text);
std::string formatDim(const Dim& d);
std::string formatShape(const std::vector<Dim>& s);
std::string formatShape(const std::vector<int64_t>& s);

// A dim at the given sizes; a symbol past `sizes` (sizes of no microbatch, for a shape that should
// be numeric) throws std::logic_error.
int64_t resolveDim(const Dim& d, const SymbolSizes& sizes);
std::vector<int64_t> resolveShape(const std::vector<Dim>& s, const SymbolSizes& sizes);
int64_t numel(const std::vector<int64_t>& s);

}  // namespace lfc
