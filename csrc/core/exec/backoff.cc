#include "core/exec/backoff.h"

#include <sched.h>
#include <time.h>

#include <sstream>

#include "core/common/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace weft {

void Backoff::pause() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

void Backoff::nap(unsigned rounds) {
  if (rounds < 64) {
    sched_yield();
    return;
  }
  // Short naps: long enough to give a core away, short enough that a
  // 5-rank job on 2 cores still moves small messages quickly.
  timespec ts{0, rounds < 1024 ? 20000 : 200000};
  nanosleep(&ts, nullptr);
}

void Backoff::throw_timeout(const std::string& what) const {
  std::ostringstream msg;
  msg << what << ": nothing arrived for " << timeout_s_
      << " s (the communicator's timeout; set it per communicator or with WEFT_TIMEOUT_S)";
  throw TimeoutError(msg.str());
}

}  // namespace weft
