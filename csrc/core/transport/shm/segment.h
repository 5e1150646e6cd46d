// A POSIX shared-memory segment (shm_open + mmap, MAP_SHARED) owned by one
// process. The creator removes the name with unlink() as soon as the peer has
// mapped it, so nothing is left in /dev/shm if either process dies later.
#pragma once

#include <cstddef>
#include <string>

namespace weft::shm {

class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Creates a zero-filled segment of `bytes` named "<prefix>-<random hex>"
  // with its memory reserved up front (no SIGBUS later when /dev/shm is full).
  // Throws weft::Error.
  static Segment create(const std::string& prefix, size_t bytes);
  // Maps the existing segment `name`, which must be at least `bytes` long.
  // Throws weft::Error.
  static Segment open(const std::string& name, size_t bytes);

  // Removes the name (the mapping stays valid). Safe to call twice.
  void unlink();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void release();

  void* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool linked_ = false;  // we created the name and have not removed it yet
};

}  // namespace weft::shm
