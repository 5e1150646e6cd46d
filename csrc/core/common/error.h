// Exceptions thrown by the core. The Python bindings map each class to a
// Python exception with the same message.
#pragma once

#include <stdexcept>
#include <string>

namespace weft {

// Base of every error weft raises.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller passed something wrong (buffer, dtype, size, rank, env var).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A wait ran past the communicator's timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A peer died, closed its connection or broke the protocol.
class PeerError : public Error {
 public:
  using Error::Error;
};

// A peer's message belongs to another operation than the one this rank runs:
// the ranks issued different collectives, or in a different order.
class OutOfStepError : public PeerError {
 public:
  using PeerError::PeerError;
};

// The communicator was aborted by an earlier error; it cannot be used again.
class AbortedError : public Error {
 public:
  using Error::Error;
};

// "lost rank N: why": how every error that blames a rank names it, so that
// the communicator can find in a message which rank it blames.
std::string lost_rank(int peer, const std::string& why);

// Throws a PeerError built from errno of a failed system call.
[[noreturn]] void throw_system_error(const std::string& what, int err);

}  // namespace weft
