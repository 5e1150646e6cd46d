// The names of collectives and of algorithm families: the vocabulary the
// Plan generators (algo/), the tuner (tune/) and the bindings share.
#pragma once

#include <cstdint>
#include <string>

namespace weft {

// Barrier has a single algorithm and no cost.
enum class Collective : uint8_t { Allreduce, ReduceScatter, Allgather, Broadcast, Reduce, Barrier };

// Algorithm families. Not every family has a form for every collective.
enum class Algorithm { Auto, Ring, Tree, Rd, Rhd, Hier, Oneshot, Chain };

// The collectives whose family depends on the world (the tuner chooses it);
// the others have one Plan each.
constexpr Collective kTunedCollectives[] = {Collective::Allreduce, Collective::ReduceScatter,
                                            Collective::Allgather, Collective::Broadcast,
                                            Collective::Reduce};

// Every family but Auto.
constexpr Algorithm kAllFamilies[] = {Algorithm::Ring, Algorithm::Tree, Algorithm::Rd,
                                      Algorithm::Rhd,  Algorithm::Hier, Algorithm::Oneshot,
                                      Algorithm::Chain};

const char* to_string(Algorithm a);
const char* to_string(Collective c);
// "auto", "ring", "tree", "rd", "rhd", "hier", "oneshot", "chain"; throws
// InvalidArgument naming the choices.
Algorithm parse_algorithm(const std::string& name);
// "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "barrier".
Collective parse_collective(const std::string& name);

}  // namespace weft
