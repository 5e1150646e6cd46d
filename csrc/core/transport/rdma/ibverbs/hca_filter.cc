#include "core/transport/rdma/ibverbs/hca_filter.h"

#include <cstdlib>

#include "core/common/error.h"

namespace weft {

HcaFilter::HcaFilter(const std::string& spec) : spec_(spec) {
  size_t at = 0;
  if (at < spec.size() && spec[at] == '^') exclude_ = true, ++at;
  if (at < spec.size() && spec[at] == '=') exact_ = true, ++at;
  const std::string list = spec.substr(at);
  if (list.empty()) {
    if (at > 0) throw InvalidArgument("WEFT_IB_HCA='" + spec + "' lists no device");
    return;
  }
  for (size_t begin = 0; begin <= list.size();) {
    size_t end = list.find(',', begin);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(begin, end - begin);
    const size_t colon = item.find(':');
    Entry entry{item.substr(0, colon), 0};
    if (colon != std::string::npos) {
      const std::string port = item.substr(colon + 1);
      char* stop = nullptr;
      const long n = std::strtol(port.c_str(), &stop, 10);
      if (port.empty() || *stop != '\0' || n < 1 || n > 255) {
        throw InvalidArgument("WEFT_IB_HCA='" + spec + "': port '" + port +
                              "' is not a port number (1-255)");
      }
      entry.port = static_cast<int>(n);
    }
    if (entry.name.empty()) {
      throw InvalidArgument("WEFT_IB_HCA='" + spec +
                            "': an empty device name; use name[:port][,name[:port]], "
                            "with a leading ^ to exclude and = for exact names");
    }
    entries_.push_back(entry);
    begin = end + 1;
  }
}

bool HcaFilter::listed(const std::string& device, int port) const {
  for (const Entry& e : entries_) {
    const bool name = exact_ ? device == e.name : device.compare(0, e.name.size(), e.name) == 0;
    if (name && (e.port == 0 || e.port == port)) return true;
  }
  return false;
}

bool HcaFilter::allows(const std::string& device, int port) const {
  if (entries_.empty()) return true;
  return listed(device, port) != exclude_;
}

}  // namespace weft
