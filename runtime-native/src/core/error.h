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

struct ProgramError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}

}  // namespace lfc
