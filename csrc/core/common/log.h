// Per-rank diagnostics on stderr, enabled by WEFT_DEBUG=INFO|TRACE.
#pragma once

#include <sstream>

#include "core/common/config.h"

namespace weft {

inline bool log_enabled(LogLevel level) { return config().log_level >= level; }

// Writes one line "weft[rank r] <message>" to stderr atomically.
void log_line(int rank, const std::string& message);

}  // namespace weft

// WEFT_LOG(Info, rank, "chose " << algo) — the stream expression is only
// evaluated when the level is enabled.
#define WEFT_LOG(level, rank, expr)                     \
  do {                                                  \
    if (::weft::log_enabled(::weft::LogLevel::level)) { \
      std::ostringstream weft_log_stream_;              \
      weft_log_stream_ << expr;                         \
      ::weft::log_line((rank), weft_log_stream_.str()); \
    }                                                   \
  } while (0)
