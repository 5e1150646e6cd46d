// WEFT_IB_HCA: which devices and ports the ibverbs transport may take, in
// the subset of NCCL_IB_HCA's syntax weft supports: `name[:port][,...]`,
// names matched as prefixes (`mlx5` takes mlx5_0, mlx5_1...), a leading `=`
// for exact names, a leading `^` to exclude the listed ones instead (`^=`
// both). Empty: every device and port.
#pragma once

#include <string>
#include <vector>

namespace weft {

class HcaFilter {
 public:
  // Throws InvalidArgument naming WEFT_IB_HCA when `spec` is malformed.
  explicit HcaFilter(const std::string& spec);
  bool allows(const std::string& device, int port) const;
  const std::string& spec() const { return spec_; }

 private:
  struct Entry {
    std::string name;
    int port;  // 0: any
  };
  bool listed(const std::string& device, int port) const;

  std::string spec_;
  bool exclude_ = false, exact_ = false;
  std::vector<Entry> entries_;
};

}  // namespace weft
