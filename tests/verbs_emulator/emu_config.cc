// The emulator's knobs (environment), its counters, GIDs, modeled delays and the two string
// verbs.
#include <arpa/inet.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "emu.h"

namespace emu {
namespace {

long number_after(const std::string& item, const char* name) {
  const std::string prefix = std::string(name) + ":";
  const std::string rest = item.substr(prefix.size());
  char* end = nullptr;
  const long v = std::strtol(rest.c_str(), &end, 10);
  if (rest.empty() || *end != '\0' || v < 0) {
    complain("WEFT_VERBS_EMU_FAULT: '%s' needs a number after '%s' (ignored)", item.c_str(),
             prefix.c_str());
    return -1;
  }
  return v;
}

bool starts(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// The async event an injected-fault item ("qp_fatal:MS", ...) names, or null.
const ibv_event_type* fatal_event_named(const std::string& item) {
  static const std::pair<const char*, ibv_event_type> kEvents[] = {
      {"device_fatal:", IBV_EVENT_DEVICE_FATAL},
      {"port_err:", IBV_EVENT_PORT_ERR},
      {"qp_fatal:", IBV_EVENT_QP_FATAL},
      {"qp_req_err:", IBV_EVENT_QP_REQ_ERR},
      {"qp_access_err:", IBV_EVENT_QP_ACCESS_ERR}};
  for (const auto& [prefix, event] : kEvents) {
    if (starts(item, prefix)) return &event;
  }
  return nullptr;
}

Config load() {
  Config c;
  if (const char* fault = std::getenv("WEFT_VERBS_EMU_FAULT")) {
    std::string all = fault;
    size_t at = 0;
    while (at <= all.size()) {
      size_t comma = all.find(',', at);
      if (comma == std::string::npos) comma = all.size();
      const std::string item = all.substr(at, comma - at);
      at = comma + 1;
      if (item.empty()) continue;
      if (item == "no_device") {
        c.no_device = true;
      } else if (item == "rnr") {
        c.rnr = true;
      } else if (starts(item, "retry_exceeded:")) {
        c.retry_exceeded_nth = number_after(item, "retry_exceeded");
      } else if (starts(item, "cq_overflow:")) {
        c.cq_clamp = number_after(item, "cq_overflow");
      } else if (const ibv_event_type* event = fatal_event_named(item)) {
        c.fatal_event = *event;
        c.fatal_ms = number_after(item, item.substr(0, item.find(':')).c_str());
      } else {
        complain(
            "WEFT_VERBS_EMU_FAULT: unknown fault '%s' (ignored); known: no_device, rnr, "
            "retry_exceeded:N, cq_overflow:K, device_fatal:MS, port_err:MS, qp_fatal:MS, "
            "qp_req_err:MS, qp_access_err:MS",
            item.c_str());
      }
    }
  }
  if (const char* t = std::getenv("WEFT_VERBS_EMU_TIMEOUT_MS")) c.timeout_cap_ms = std::atol(t);
  if (const char* s = std::getenv("WEFT_VERBS_EMU_STATS")) c.stats_dir = s;
  if (const char* odp = std::getenv("WEFT_VERBS_EMU_ODP")) {
    constexpr uint32_t kRc =
        IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ;
    if (std::strcmp(odp, "1") == 0) {
      c.odp = true;
      c.odp_rc_caps = kRc;
    } else if (std::strcmp(odp, "no_rc_write") == 0) {
      c.odp = true;
      c.odp_rc_caps = kRc & ~IBV_ODP_SUPPORT_WRITE;
    } else if (std::strcmp(odp, "0") != 0) {
      complain("WEFT_VERBS_EMU_ODP: unknown value '%s' (ignored); known: 0, 1, no_rc_write", odp);
    }
  }
  const char* dir = std::getenv("WEFT_VERBS_EMU_DIR");
  c.socket_dir = dir && *dir ? dir : "/tmp/weft-verbs-emu";
  return c;
}

}  // namespace

const Config& config() {
  static const Config c = load();
  return c;
}

void complain(const char* fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "weft_verbs_emu[%d]: %s\n", static_cast<int>(getpid()), line);
}

Stats& stats() {
  static Stats s;
  return s;
}

void write_stats() {
  const Config& c = config();
  if (c.stats_dir.empty()) return;
  const Stats& s = stats();
  const std::string path = c.stats_dir + "/verbs_emu." + std::to_string(getpid()) + ".json";
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) {
    complain("cannot write %s: %s", tmp.c_str(), std::strerror(errno));
    return;
  }
  std::fprintf(f,
               "{\"pid\": %d, \"writes\": %lu, \"writes_with_imm\": %lu, "
               "\"receives_consumed\": %lu, \"rnr_naks_sent\": %lu, \"rnr_naks_received\": %lu, "
               "\"payload_bytes\": %lu, \"wire_messages\": %lu, \"wire_bytes\": %lu, "
               "\"acks_sent\": %lu, \"retransmissions\": %lu, \"error_completions\": %lu, "
               "\"rts_timeouts_mask\": %lu, \"rts_retry_cnts_mask\": %lu, \"reg_mrs\": %lu, "
               "\"reg_mrs_on_demand\": %lu, \"dereg_mrs\": %lu, \"mrs_peak\": %lu}\n",
               static_cast<int>(getpid()), s.writes.load(), s.writes_with_imm.load(),
               s.receives_consumed.load(), s.rnr_naks_sent.load(), s.rnr_naks_received.load(),
               s.payload_bytes.load(), s.wire_messages.load(), s.wire_bytes.load(),
               s.acks_sent.load(), s.retransmissions.load(), s.error_completions.load(),
               s.rts_timeouts.load(), s.rts_retry_cnts.load(), s.reg_mrs.load(),
               s.reg_mrs_on_demand.load(), s.dereg_mrs.load(), s.mrs_peak.load());
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

ibv_gid make_gid(const Endpoint& e, int index) {
  ibv_gid g{};
  if (index >= 2 && e.pid < (1u << 24) && e.instance < 256) {  // ::ffff:<pid, instance>
    g.raw[10] = g.raw[11] = 0xff;
    const uint32_t v = htonl(e.pid << 8 | e.instance);
    std::memcpy(g.raw + 12, &v, 4);
    return g;
  }
  g.raw[0] = 0xfe;
  g.raw[1] = 0x80;
  g.raw[4] = 'w';
  g.raw[5] = 'e';
  g.raw[6] = 'm';
  g.raw[7] = static_cast<uint8_t>(index);
  const uint32_t pid = htonl(e.pid), inst = htonl(e.instance);
  std::memcpy(g.raw + 8, &pid, 4);
  std::memcpy(g.raw + 12, &inst, 4);
  return g;
}

bool parse_gid(const ibv_gid& g, Endpoint* e) {
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(g.raw, kMapped, sizeof kMapped) == 0) {
    uint32_t v;
    std::memcpy(&v, g.raw + 12, 4);
    v = ntohl(v);
    e->pid = v >> 8;
    e->instance = v & 0xff;
    return true;
  }
  if (g.raw[0] != 0xfe || g.raw[1] != 0x80 || g.raw[4] != 'w' || g.raw[5] != 'e' ||
      g.raw[6] != 'm' || g.raw[7] >= kGidTableLen)
    return false;
  uint32_t pid, inst;
  std::memcpy(&pid, g.raw + 8, 4);
  std::memcpy(&inst, g.raw + 12, 4);
  e->pid = ntohl(pid);
  e->instance = ntohl(inst);
  return true;
}

// 4.096 us * 2^timeout per try, retry_cnt + 1 tries, at most WEFT_VERBS_EMU_TIMEOUT_MS
// (timeout 0 means "infinite" in IB: the cap).
std::chrono::microseconds transport_timeout(const Qp* qp) {
  const std::chrono::microseconds cap(config().timeout_cap_ms * 1000);
  const unsigned t = qp->attr.timeout;
  if (t == 0 || t >= 31) return cap;
  const double us = 4.096 * static_cast<double>(1ull << t) * (qp->attr.retry_cnt + 1);
  return std::min(cap, std::chrono::microseconds(static_cast<long long>(us)));
}

// The IB encoding of min_rnr_timer, in microseconds.
std::chrono::microseconds rnr_delay(uint32_t code) {
  static const int kUs[32] = {655360, 10,    20,    30,     40,     60,     80,     120,
                              160,    240,   320,   480,    640,    960,    1280,   1920,
                              2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
                              40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return std::chrono::microseconds(kUs[code & 31]);
}

}  // namespace emu

EMU_API const char* ibv_wc_status_str(enum ibv_wc_status status) {
  static const char* const kNames[] = {"success",
                                       "local length error",
                                       "local QP operation error",
                                       "local EE context operation error",
                                       "local protection error",
                                       "Work Request Flushed Error",
                                       "memory management operation error",
                                       "bad response error",
                                       "local access error",
                                       "remote invalid request error",
                                       "remote access error",
                                       "remote operation error",
                                       "transport retry counter exceeded",
                                       "RNR retry counter exceeded",
                                       "local RDD violation error",
                                       "remote invalid RD request",
                                       "aborted error",
                                       "invalid EE context number",
                                       "invalid EE context state",
                                       "fatal error",
                                       "response timeout error",
                                       "general error",
                                       "TM error",
                                       "TM rendezvous error"};
  const unsigned i = static_cast<unsigned>(status);
  return i < sizeof kNames / sizeof kNames[0] ? kNames[i] : "unknown";
}

EMU_API const char* ibv_event_type_str(enum ibv_event_type event) {
  static const char* const kNames[] = {"CQ error",
                                       "local work queue catastrophic error",
                                       "invalid request local work queue error",
                                       "local access violation work queue error",
                                       "communication established",
                                       "send queue drained",
                                       "path migrated",
                                       "path migration request error",
                                       "local catastrophic error",
                                       "port active",
                                       "port error",
                                       "LID change",
                                       "P_Key change",
                                       "SM change",
                                       "SRQ catastrophic error",
                                       "SRQ limit reached",
                                       "last WQE reached",
                                       "client reregistration",
                                       "GID table change",
                                       "WQ fatal"};
  const unsigned i = static_cast<unsigned>(event);
  return i < sizeof kNames / sizeof kNames[0] ? kNames[i] : "unknown";
}
