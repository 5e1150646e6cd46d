#include "core/transport/shm/cma.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/common/error.h"

namespace weft::shm {

void cma_read(int pid, uint64_t remote, void* dst, size_t bytes) {
  char* out = static_cast<char*>(dst);
  size_t done = 0;
  while (done < bytes) {
    iovec local{out + done, bytes - done};
    iovec peer{reinterpret_cast<void*>(static_cast<uintptr_t>(remote + done)), bytes - done};
    ssize_t n = ::process_vm_readv(pid, &local, 1, &peer, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    int err = n < 0 ? errno : EFAULT;  // 0 bytes: nothing more is readable
    if (err == EINTR) continue;
    if (err == ESRCH) throw PeerError("peer process is gone");
    throw PeerError("process_vm_readv of " + std::to_string(bytes) + " bytes from the peer: " +
                    std::strerror(err) + (err == EPERM ? " (set WEFT_SHM_CMA=0)" : ""));
  }
}

bool cma_probe(int pid, uint64_t remote, uint64_t expected) {
  uint64_t word = 0;
  iovec local{&word, sizeof(word)};
  iovec peer{reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), sizeof(word)};
  return ::process_vm_readv(pid, &local, 1, &peer, 1, 0) == static_cast<ssize_t>(sizeof(word)) &&
         word == expected;
}

}  // namespace weft::shm
