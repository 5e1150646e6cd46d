// Checks a Plan that did not come from weft's generators (weft.topo.run)
// before the executor runs it: every peer, span and count must make sense
// for this rank's buffers, or the executor would read or write outside them.
#pragma once

#include <cstddef>

#include "core/algo/plan.h"

namespace weft::algo {

// Throws InvalidArgument naming the step and what is wrong: a peer outside
// [0, size) or the rank itself, a span outside Input (in_count elements),
// Output (out_count) or Scratch (plan.scratch_count, which must fit in
// memory at elem_size bytes each), a write into Input, lengths or overlaps a
// step's form does not allow (see plan.h); a channel outside the Plan's
// channels, a tag of `tags` or more (the connection sets there are), a
// dependency on a step that is not earlier, or two channels sending (or
// receiving) on one tag to one peer, whose messages would interleave.
void validate(const Plan& plan, int rank, int size, size_t in_count, size_t out_count,
              size_t elem_size, size_t tags);

}  // namespace weft::algo
