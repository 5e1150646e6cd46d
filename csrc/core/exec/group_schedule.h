// A Plan rewritten for a transport whose sends block until the peer
// receives (NCCL's ncclSend/ncclRecv), whose operations all run in order on
// one GPU stream: batches of sends and receives that progress together (one
// ncclGroupStart/End each) and reduction kernels between them.
//
// The CPU executor (executor.cc) streams a step's slices through buffered
// connections: a send completes before the peer receives, so a rank never
// waits on its own sends. Here a send is posted lazily instead: sends and
// receives collect in a pending batch, and the batch is closed only when a
// later action needs its result (a reduction or a send that reads memory a
// pending receive writes) or would overwrite memory a pending send reads.
// So whenever a rank waits, the sends it could post are in the batch it
// waits on, with its receives (ring steps become {send to next, receive from
// previous} batches, as in NCCL's own rings).
//
// Each step moves one message per peer and direction: the Plan's own rounds
// (PlanContext::max_step_bytes) are the pipeline. Cutting a step into
// slices is not safe here: a batch then holds a step's later slices too,
// whose receives the peer posts only after a batch that waits for ours (a
// deadlock that tests/test_group_schedule.py's replay finds). Empty messages
// are left out on both sides.
//
// Received data that is reduced goes to temporary memory first: two arenas
// used in turn by batch, since a temporary lives from its batch to the end
// of the next one (then every use of it is queued on the stream before the
// arena is reused). Plain C++: no CUDA, no NCCL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/algo/plan.h"

namespace weft::group {

// Memory an action names: the operation's buffers, the Plan's scratch, and
// the two temporary arenas.
enum class Region : uint8_t { Input, Output, Scratch, Temp0, Temp1 };

struct Ref {
  Region region;
  size_t offset;  // bytes
};

struct Transfer {
  bool send;  // else receive
  int peer;
  Ref at;
  size_t bytes;
};

struct Action {
  enum class Kind : uint8_t { Batch, Reduce };
  Kind kind = Kind::Batch;
  // Batch: transfers that progress together.
  std::vector<Transfer> transfers;
  // Reduce: dst = srcs[0] (op) srcs[1] ... (count elements; one source is a
  // copy), divided by the world size for Avg when `finalize`. dst may be one
  // of the sources.
  Ref dst{Region::Output, 0};
  std::vector<Ref> srcs;
  size_t count = 0;
  bool finalize = false;
};

struct Schedule {
  std::vector<Action> actions;
  size_t temp_bytes = 0;  // size of each of Temp0 and Temp1
};

// The schedule of `plan` for elements of `elem` bytes. `input_in_output`:
// the Input buffer is the Output buffer at this byte offset (in place), so
// the two alias; nullopt when they are apart. `max_inputs` bounds the
// sources of one Reduce (longer LocalReduce folds take several).
Schedule schedule(const Plan& plan, size_t elem, std::optional<size_t> input_in_output,
                  int max_inputs);

}  // namespace weft::group
