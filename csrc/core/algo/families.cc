#include "core/algo/families.h"

#include "core/common/error.h"

namespace weft {

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::Auto: return "auto";
    case Algorithm::Ring: return "ring";
    case Algorithm::Tree: return "tree";
    case Algorithm::Rd: return "rd";
    case Algorithm::Rhd: return "rhd";
    case Algorithm::Hier: return "hier";
    case Algorithm::Oneshot: return "oneshot";
    case Algorithm::Chain: return "chain";
  }
  return "?";
}

const char* to_string(Collective c) {
  switch (c) {
    case Collective::Allreduce: return "allreduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::Allgather: return "allgather";
    case Collective::Broadcast: return "broadcast";
    case Collective::Reduce: return "reduce";
    case Collective::Barrier: return "barrier";
  }
  return "?";
}

Algorithm parse_algorithm(const std::string& name) {
  if (name == "auto") return Algorithm::Auto;
  for (Algorithm a : kAllFamilies) {
    if (name == to_string(a)) return a;
  }
  throw InvalidArgument("unknown algorithm '" + name +
                        "': use auto, ring, tree, rd, rhd, hier, oneshot or chain");
}

Collective parse_collective(const std::string& name) {
  for (Collective c : {Collective::Allreduce, Collective::ReduceScatter, Collective::Allgather,
                       Collective::Broadcast, Collective::Reduce, Collective::Barrier}) {
    if (name == to_string(c)) return c;
  }
  throw InvalidArgument(
      "unknown collective '" + name +
      "': use allreduce, reduce_scatter, allgather, broadcast, reduce or barrier");
}

}  // namespace weft
