// libFuzzer target: the tcp transport's receiving side reading whatever its
// peer sends, message headers included. The input's first 11 bytes say what
// the receiver expects (an operation signature of 8 bytes, a length up to
// 64 KiB, and whether it stages through recv_slot or reads into its own
// buffer); the rest is the byte stream the peer writes before it closes.
// Messages are received one after another until one fails: each must either
// raise a weft::Error or return exactly the payload the stream carried after
// a header naming that length and operation. Anything else (a success the
// stream does not hold, a claimed length allocated, a read out of bounds, a
// receive that neither ends nor fails) is a bug, and the target aborts.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/bootstrap/socket.h"
#include "core/common/error.h"
#include "core/transport/tcp/tcp_connection.h"

namespace {

constexpr size_t kSetupBytes = 11;
constexpr size_t kHeaderBytes = 16;  // length, operation (tcp_connection.cc's Header)
constexpr int kMaxPolls = 100000;

struct Expected {
  uint64_t operation;
  size_t length;
  bool into_slot;
};

uint64_t word(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

// What the stream holds at `pos` for a receive of `want`: the payload, or
// nothing where the receive must fail.
const uint8_t* message_at(const std::vector<uint8_t>& stream, size_t pos, const Expected& want) {
  if (stream.size() - pos < kHeaderBytes) return nullptr;
  if (word(&stream[pos]) != want.length || word(&stream[pos + 8]) != want.operation) {
    return nullptr;
  }
  if (stream.size() - pos - kHeaderBytes < want.length) return nullptr;
  return &stream[pos + kHeaderBytes];
}

// A connected pair of loopback TCP sockets (the transport sets TCP options),
// both closed with a reset so that no TIME_WAIT piles up over many runs.
bool tcp_pair(int fds[2]) {
  static int listener = -1;
  static sockaddr_in address{};
  socklen_t length = sizeof(address);
  if (listener < 0) {
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int buffer = 1 << 20;
    ::setsockopt(listener, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
    if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        ::listen(listener, 1) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      std::abort();
    }
  }
  fds[1] = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fds[1], reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fds[1]);
    return false;
  }
  fds[0] = ::accept(listener, nullptr, nullptr);
  const linger reset{1, 0};
  for (int i = 0; i < 2; ++i) ::setsockopt(fds[i], SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  return fds[0] >= 0;
}

// Receives one message; true with `out` filled, false once the connection
// failed. Aborts on a receive that never settles.
bool receive(weft::Connection& conn, const Expected& want, std::vector<uint8_t>& out) {
  out.assign(want.length, 0);
  for (int poll = 0; poll < kMaxPolls; ++poll) {
    try {
      if (want.into_slot) {
        if (const void* got = conn.recv_slot(want.length)) {
          if (want.length > 0) std::memcpy(out.data(), got, want.length);
          conn.release_recv();
          return true;
        }
      } else if (conn.recv_into(out.data(), want.length)) {
        return true;
      }
      conn.progress();
    } catch (const weft::Error&) {
      return false;
    }
  }
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kSetupBytes || size - kSetupBytes > (64 << 10)) return 0;
  Expected want{word(data), static_cast<size_t>(data[8] | (data[9] << 8)), (data[10] & 1) != 0};
  const std::vector<uint8_t> stream(data + kSetupBytes, data + size);

  int data_fds[2], control_fds[2];
  if (!tcp_pair(data_fds)) return 0;
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, control_fds) != 0) {
    ::close(data_fds[0]);
    ::close(data_fds[1]);
    return 0;
  }
  weft::Socket control(control_fds[0]), control_peer(control_fds[1]);
  // The peer's whole stream, then its end (the sockets' buffers hold it).
  int buffer = 1 << 20;
  ::setsockopt(data_fds[1], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  for (size_t sent = 0; sent < stream.size();) {
    const ssize_t n = ::send(data_fds[1], stream.data() + sent, stream.size() - sent, 0);
    if (n <= 0) std::abort();
    sent += static_cast<size_t>(n);
  }
  ::close(data_fds[1]);

  auto conn =
      weft::make_tcp_connection(control, weft::Socket(data_fds[0]), weft::TcpOptions{64 << 10, 2});
  conn->set_operation(want.operation);
  std::vector<uint8_t> got;
  for (size_t pos = 0;; pos += kHeaderBytes + want.length) {
    const uint8_t* expected = pos <= stream.size() ? message_at(stream, pos, want) : nullptr;
    if (!receive(*conn, want, got)) return 0;
    // A success must be the stream's next message, byte for byte.
    if (expected == nullptr) std::abort();
    if (want.length > 0 && std::memcmp(got.data(), expected, want.length) != 0) std::abort();
  }
}
