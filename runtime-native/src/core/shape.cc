#include "core/shape.h"

#include <cctype>
#include <sstream>
#include <stdexcept>

namespace lfc {

namespace {

bool allDigits(const std::string& s) {
  if (s.empty() || s.size() > 15) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

bool isIdent(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

}  // namespace

SymbolTable::SymbolTable() : decls_{{"S", -1}, {"Nv", -1}} {}

void SymbolTable::declare(const std::string& name, int64_t bound) {
  if (!isIdent(name)) throw std::invalid_argument("symbol name '" + name + "' is not an identifier");
  const int s = find(name);
  if (s >= 0 && !runTime(s)) return;  // S and Nv come from the data, whatever their bound
  if (bound < 0) throw std::invalid_argument("symbol " + name + " has a negative bound");
  if (s >= 0 && decls_[size_t(s)].bound != bound)
    throw std::invalid_argument("symbol " + name + " is declared with bounds " +
                                std::to_string(decls_[size_t(s)].bound) + " and " + std::to_string(bound));
  if (s < 0) decls_.push_back({name, bound});
}

int SymbolTable::find(const std::string& name) const {
  for (size_t s = 0; s < decls_.size(); s++)
    if (decls_[s].name == name) return int(s);
  return -1;
}

SymbolSizes SymbolTable::atBounds() const {
  SymbolSizes sizes(decls_.size(), 0);
  for (size_t s = kDataSymbolCount; s < decls_.size(); s++) sizes[s] = decls_[s].bound;
  return sizes;
}

std::string SymbolTable::names() const {
  std::string out;
  for (size_t s = 0; s < decls_.size(); s++) out += (s ? ", " : "") + decls_[s].name;
  return out;
}

Dim parseDim(const std::string& raw) { return parseDim(raw, SymbolTable{}); }

Dim parseDim(const std::string& raw, const SymbolTable& table) {
  std::string t;
  for (char c : raw)
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument("bad dim '" + raw + "': " + why);
  };
  Dim d;
  if (allDigits(t)) {
    d.value = std::stoll(t);
    return d;
  }
  // [num*]Sym[/den]
  std::string body = t;
  const auto star = body.find('*');
  if (star != std::string::npos) {
    const std::string n = body.substr(0, star);
    if (!allDigits(n)) throw bad("the factor before '*' must be a number");
    d.num = std::stoll(n);
    body = body.substr(star + 1);
  }
  const auto slash = body.find('/');
  if (slash != std::string::npos) {
    const std::string n = body.substr(slash + 1);
    if (!allDigits(n)) throw bad("the divisor after '/' must be a number");
    d.den = std::stoll(n);
    body = body.substr(0, slash);
  }
  if (!isIdent(body)) throw bad("expected a number or [k*]Symbol[/d]");
  if (d.num <= 0 || d.den <= 0) throw bad("factors must be positive");
  d.sym = table.find(body);
  if (d.sym < 0) {
    throw bad("unknown symbol '" + body + "' (this runtime resolves " + table.names() +
              "); a symbol the data does not give needs its bound from plan.json's symbols");
  }
  d.name = body;
  return d;
}

std::string formatDim(const Dim& d) {
  if (d.sym < 0) return std::to_string(d.value);
  std::string s;
  if (d.num != 1) s += std::to_string(d.num) + "*";
  s += d.name;
  if (d.den != 1) s += "/" + std::to_string(d.den);
  return s;
}

std::string formatShape(const std::vector<Dim>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); i++) out += (i ? ", " : "") + formatDim(s[i]);
  return out + "]";
}

std::string formatShape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); i++) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t resolveDim(const Dim& d, const SymbolSizes& sizes) {
  if (d.sym < 0) return d.value;
  if (size_t(d.sym) >= sizes.size())
    throw std::logic_error("dim " + formatDim(d) + " resolved without the sizes of a microbatch");
  return sizes[size_t(d.sym)] * d.num / d.den;
}

std::vector<int64_t> resolveShape(const std::vector<Dim>& s, const SymbolSizes& sizes) {
  std::vector<int64_t> out(s.size());
  for (size_t i = 0; i < s.size(); i++) out[i] = resolveDim(s[i], sizes);
  return out;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace lfc
