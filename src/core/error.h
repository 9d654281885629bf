// Errors: one exception type carrying a message that names the file / tensor / field at fault.
#pragma once
#include <stdexcept>
#include <string>

namespace lilac {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Input the user gave us is wrong (bad request, bad file). Servers map it to 4xx.
class InputError : public Error {
 public:
  explicit InputError(const std::string& msg) : Error(msg) {}
};

#define LILAC_CHECK(cond, msg)                      \
  do {                                              \
    if (!(cond)) throw ::lilac::Error(msg);         \
  } while (0)

}  // namespace lilac
