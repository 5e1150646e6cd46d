// Cross-memory attach: reading another process's memory with
// process_vm_readv, for single-copy transfers between ranks of one host.
#pragma once

#include <cstddef>
#include <cstdint>

namespace weft::shm {

// Copies `bytes` at address `remote` of process `pid` into `dst`. Throws
// PeerError ("peer process is gone" when it exited).
void cma_read(int pid, uint64_t remote, void* dst, size_t bytes);

// True when this process may read `pid`'s memory: reads the 8-byte word at
// `remote` and compares it with `expected`. Never throws.
bool cma_probe(int pid, uint64_t remote, uint64_t expected);

}  // namespace weft::shm
