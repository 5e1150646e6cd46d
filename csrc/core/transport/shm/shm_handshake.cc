#include "core/transport/shm/shm_handshake.h"

#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "core/common/deadline.h"
#include "core/common/error.h"
#include "core/common/random_word.h"
#include "core/transport/shm/cma.h"

namespace weft::shm {
namespace {

// Removes the names of the segments `peer_pid` made for this rank's
// connection `channel` (it unlinks them once the handshake ends; a peer
// killed before that cannot), so that none outlives a failed setup.
void remove_segments_of(int peer_pid, int rank, int channel) {
  const std::string prefix = "weft-" + std::to_string(peer_pid) + "-" + std::to_string(rank) + "-" +
                             std::to_string(channel) + "-";
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  while (const dirent* entry = ::readdir(dir)) {
    if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) == 0) {
      ::shm_unlink(("/" + std::string(entry->d_name)).c_str());
    }
  }
  ::closedir(dir);
}

constexpr uint64_t kHelloMagic = 0x6f6c6c65686d6877ULL;  // "whmhello"
constexpr uint64_t kAckMagic = 0x6b63616d6873776bULL;
constexpr uint32_t kProtocolVersion = 1;

enum Status : uint32_t { kOk = 0, kBadHello, kConfigMismatch, kNoSegment, kMapFailed };

// Both ranks run the same build on one host, so a fixed-layout struct is the
// wire format.
struct Hello {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  int32_t pid;
  uint32_t slots;
  uint64_t slot_bytes;
  uint64_t wants_cma;      // the sender would like to send by reference
  uint64_t probe_address;  // a word the peer reads to test process_vm_readv
  uint64_t probe_value;
  char name[128];  // empty when the segment could not be created
};

struct Ack {
  uint64_t magic;
  uint32_t status;
  uint32_t can_read_you;
};

// Checks the peer's hello and maps its segment into `out`; returns the status
// and fills `error` when it is not kOk.
Status accept_hello(const Hello& theirs, int rank, int peer, const FifoLayout& layout, Segment& out,
                    std::string& error) {
  if (theirs.magic != kHelloMagic || theirs.version != kProtocolVersion || theirs.rank != peer ||
      theirs.name[sizeof(theirs.name) - 1] != '\0') {
    error = "unexpected handshake message (different weft versions, or ranks out of step)";
    return kBadHello;
  }
  if (theirs.slots != layout.slots || theirs.slot_bytes != layout.slot_bytes) {
    error = "WEFT_SHM_SLOTS/WEFT_SHM_SLOT_BYTES differ between ranks: rank " +
            std::to_string(rank) + " uses " + std::to_string(layout.slots) + " x " +
            std::to_string(layout.slot_bytes) + " bytes, rank " + std::to_string(peer) + " uses " +
            std::to_string(theirs.slots) + " x " + std::to_string(theirs.slot_bytes);
    return kConfigMismatch;
  }
  if (theirs.name[0] == '\0') {
    error = "the peer could not create its shared-memory segment";
    return kNoSegment;
  }
  try {
    out = Segment::open(theirs.name, layout.total_bytes);
  } catch (const Error& e) {
    error = e.what();
    return kMapFailed;
  }
  const char* mismatch = check_fifo(out.data(), layout);
  if (mismatch[0] != '\0') {
    error = std::string("segment ") + theirs.name + ": " + mismatch;
    return kMapFailed;
  }
  return kOk;
}

}  // namespace

Endpoints handshake(Socket& control, int rank, int peer, int peer_pid, int channel,
                    const ShmOptions& options, double timeout_s) {
  Deadline deadline(timeout_s);
  const std::string what =
      "shm setup with rank " + std::to_string(peer) + " (channel " + std::to_string(channel) + ")";
  Endpoints ends;
  ends.layout = FifoLayout::compute(options.slots, options.slot_bytes);

  // The probe word must stay alive until the peer's ack arrives; it is.
  volatile uint64_t probe = random_word();
  Hello mine{};
  mine.magic = kHelloMagic;
  mine.version = kProtocolVersion;
  mine.rank = rank;
  mine.pid = static_cast<int32_t>(::getpid());
  mine.slots = static_cast<uint32_t>(ends.layout.slots);
  mine.slot_bytes = ends.layout.slot_bytes;
  mine.wants_cma = options.cma ? 1 : 0;
  mine.probe_address = reinterpret_cast<uintptr_t>(&probe);
  mine.probe_value = probe;

  std::string create_error;
  try {
    ends.incoming = Segment::create("/weft-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(peer) + "-" + std::to_string(channel),
                                    ends.layout.total_bytes);
    init_fifo(ends.incoming.data(), ends.layout);
    std::strncpy(mine.name, ends.incoming.name().c_str(), sizeof(mine.name) - 1);
  } catch (const Error& e) {
    create_error = e.what();  // still take part, so the peer fails now, not at its timeout
  }

  std::string error;
  Status status = kOk;
  Ack peer_ack{};
  try {
    control.send_all(&mine, sizeof(mine), deadline, what + ": sending segment name");
    Hello theirs{};
    control.recv_all(&theirs, sizeof(theirs), deadline, what + ": receiving segment name");

    status = accept_hello(theirs, rank, peer, ends.layout, ends.outgoing, error);
    Ack ack{kAckMagic, status, 0};
    if (status == kOk && theirs.wants_cma && theirs.pid == peer_pid) {
      ack.can_read_you = cma_probe(peer_pid, theirs.probe_address, theirs.probe_value) ? 1 : 0;
    }
    ends.we_read_peer = ack.can_read_you != 0;
    control.send_all(&ack, sizeof(ack), deadline, what + ": sending ack");
    if (status == kBadHello) throw PeerError(what + ": " + error);

    control.recv_all(&peer_ack, sizeof(peer_ack), deadline, what + ": receiving ack");
  } catch (...) {
    remove_segments_of(peer_pid, rank, channel);
    throw;  // ends.incoming unlinks this rank's own segment as it goes
  }
  ends.incoming.unlink();  // the peer has mapped it (or given up): drop the name now

  if (!create_error.empty()) throw Error(what + ": " + create_error);
  if (status == kConfigMismatch) throw InvalidArgument(what + ": " + error);
  if (status != kOk) throw PeerError(what + ": " + error);
  if (peer_ack.magic != kAckMagic) throw PeerError(what + ": unexpected handshake ack");
  if (peer_ack.status == kConfigMismatch) {
    throw InvalidArgument(what + ": the peer reports different WEFT_SHM_SLOTS/WEFT_SHM_SLOT_BYTES");
  }
  if (peer_ack.status != kOk) throw PeerError(what + ": the peer could not map our segment");
  ends.peer_reads_us = peer_ack.can_read_you != 0;
  return ends;
}

}  // namespace weft::shm
