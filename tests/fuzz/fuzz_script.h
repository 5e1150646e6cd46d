// A fuzz input's bytes, read front to back by the targets' scripts: an
// operation cut short by the end of the input ends the script.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

class Script {
 public:
  Script(const uint8_t* data, size_t size) : next_(data), end_(data + size) {}
  bool done() const { return next_ == end_; }
  size_t left() const { return static_cast<size_t>(end_ - next_); }
  // Copies the next `bytes`; false (and the script ends) when fewer are left.
  bool take(void* out, size_t bytes) {
    if (left() < bytes) {
      next_ = end_;
      return false;
    }
    if (bytes > 0) std::memcpy(out, next_, bytes);
    next_ += bytes;
    return true;
  }
  template <typename T>
  bool get(T& value) {
    return take(&value, sizeof(value));
  }
  // Up to `bytes` of what is left (all of it when fewer are).
  std::pair<const uint8_t*, size_t> some(size_t bytes) {
    const uint8_t* start = next_;
    bytes = std::min(bytes, left());
    next_ += bytes;
    return {start, bytes};
  }

 private:
  const uint8_t* next_;
  const uint8_t* end_;
};
