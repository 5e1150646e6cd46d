#include "core/bootstrap/address.h"

#include <cstring>

namespace weft {
namespace {

constexpr uint32_t kAddressMagic = 0x57464143;  // "WFAC"

// The ranks of one job share an architecture: fields travel in host order.
template <typename T>
void put(std::vector<uint8_t>& out, const T& value) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(&value);
  out.insert(out.end(), p, p + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& in) : in_(in) {}
  template <typename T>
  bool get(T& value) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_flag(bool& value) {
    uint8_t byte = 0;
    if (!get(byte) || byte > 1) return false;
    value = byte == 1;
    return true;
  }
  // The length is checked against the bytes left before anything is copied.
  bool get_string(std::string& s) {
    uint32_t n = 0;
    if (!get(n) || in_.size() - pos_ < n) return false;
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  const std::vector<uint8_t>& in_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<uint8_t> encode_address(const PeerAddress& a) {
  std::vector<uint8_t> out;
  put(out, kAddressMagic);
  put(out, a.size);
  put(out, a.pid);
  put(out, a.port);
  put(out, static_cast<uint8_t>(a.listens_any));
  put(out, static_cast<uint8_t>(a.secret_from_env));
  put_string(out, a.host_id);
  put_string(out, a.cpus);
  put(out, a.spread.ranks);
  put(out, a.spread.index);
  put_string(out, a.ip);
  return out;
}

std::optional<PeerAddress> decode_address(const std::vector<uint8_t>& bytes) {
  PeerAddress a;
  Reader r(bytes);
  uint32_t magic = 0;
  if (!r.get(magic) || magic != kAddressMagic || !r.get(a.size) || !r.get(a.pid) ||
      !r.get(a.port) || !r.get_flag(a.listens_any) || !r.get_flag(a.secret_from_env) ||
      !r.get_string(a.host_id) || !r.get_string(a.cpus) || !r.get(a.spread.ranks) ||
      !r.get(a.spread.index) || !r.get_string(a.ip) || !r.done()) {
    return std::nullopt;
  }
  return a;
}

}  // namespace weft
