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

Dim parseDim(const std::string& raw) {
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
  for (int s = 0; s < kSymbolCount; s++)
    if (body == kSymbolNames[s]) d.sym = s;
  if (d.sym < 0) {
    std::string known;
    for (int s = 0; s < kSymbolCount; s++) known += std::string(s ? ", " : "") + kSymbolNames[s];
    throw bad("unknown symbol '" + body + "' (this runtime resolves " + known + ")");
  }
  return d;
}

std::string formatDim(const Dim& d) {
  if (d.sym < 0) return std::to_string(d.value);
  std::string s;
  if (d.num != 1) s += std::to_string(d.num) + "*";
  s += kSymbolNames[d.sym];
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
