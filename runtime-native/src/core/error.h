// Error types of the runtime and a message builder.
//
// ProgramError: the program JSON is malformed or breaks a rule (thrown at load, before anything
// runs). RuntimeError: a call does not fit the loaded program (bad slot, data over a bound, a step
// while another runs, a kernel failure), thrown at the call. Both surface in JS as Error with the
// same message.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lfc {

// A message on one line whatever text from the user's files it quotes (a name, an init string):
// line breaks and other control characters written as \n, \r, \t or \xNN.
inline std::string oneLine(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

// Both errors keep their message on one line (oneLine), as the CLI prints it.
struct ProgramError : std::runtime_error {
  explicit ProgramError(const std::string& message) : std::runtime_error(oneLine(message)) {}
};

struct RuntimeError : std::runtime_error {
  explicit RuntimeError(const std::string& message) : std::runtime_error(oneLine(message)) {}
};

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}

}  // namespace lfc
