#include "core/transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "core/common/error.h"
#include "core/common/random_word.h"

namespace weft::shm {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& name, int err) {
  throw Error(what + "(" + name + "): " + std::strerror(err));
}

std::string random_suffix() {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(random_word()));
  return text;
}

// Maps `bytes` of `fd` read-write and closes it (the mapping outlives the
// descriptor); MAP_POPULATE pre-faults the pages so the data path never takes
// a page fault.
void* map_and_close(int fd, size_t bytes, const std::string& name) {
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (data == MAP_FAILED) fail("mmap", name, err);
  return data;
}

}  // namespace

Segment::~Segment() { release(); }

Segment::Segment(Segment&& other) noexcept
    : data_(other.data_),
      size_(other.size_),
      name_(std::move(other.name_)),
      linked_(other.linked_) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.linked_ = false;
}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    name_ = std::move(other.name_);
    linked_ = other.linked_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.linked_ = false;
  }
  return *this;
}

void Segment::release() {
  unlink();
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void Segment::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

Segment Segment::create(const std::string& prefix, size_t bytes) {
  Segment segment;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    segment.name_ = prefix + "-" + random_suffix();
    fd = ::shm_open(segment.name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && (errno != EEXIST || attempt == 8)) fail("shm_open", segment.name_, errno);
  }
  segment.linked_ = true;  // from here on the destructor removes the name
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err == EOPNOTSUPP || err == EINVAL) {
    err = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  }
  if (err != 0) {
    ::close(fd);
    fail("allocating shared memory of " + std::to_string(bytes) + " bytes for", segment.name_, err);
  }
  segment.data_ = map_and_close(fd, bytes, segment.name_);
  segment.size_ = bytes;
  return segment;
}

Segment Segment::open(const std::string& name, size_t bytes) {
  Segment segment;
  segment.name_ = name;
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) fail("shm_open", name, errno);
  struct stat info{};
  if (::fstat(fd, &info) != 0) {
    int err = errno;
    ::close(fd);
    fail("fstat", name, err);
  }
  if (static_cast<size_t>(info.st_size) < bytes) {
    ::close(fd);
    throw Error("shared-memory segment " + name + " has " + std::to_string(info.st_size) +
                " bytes, expected " + std::to_string(bytes));
  }
  segment.data_ = map_and_close(fd, bytes, segment.name_);
  segment.size_ = bytes;
  return segment;
}

}  // namespace weft::shm
