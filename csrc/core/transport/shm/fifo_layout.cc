#include "core/transport/shm/fifo_layout.h"

#include <algorithm>
#include <cstdint>
#include <new>
#include <string>

#include "core/common/error.h"

namespace weft::shm {
namespace {

size_t round_up(size_t value, size_t align) { return (value + align - 1) / align * align; }

}  // namespace

FifoLayout FifoLayout::compute(int slots, size_t slot_bytes) {
  // Limits keep the arithmetic below far from overflow.
  if (slots < 1 || slots > 4096) {
    throw InvalidArgument("shared-memory FIFO: slots=" + std::to_string(slots) +
                          " (WEFT_SHM_SLOTS) must be between 1 and 4096");
  }
  if (slot_bytes < 1 || slot_bytes > (size_t{1} << 32)) {
    throw InvalidArgument("shared-memory FIFO: slot_bytes=" + std::to_string(slot_bytes) +
                          " (WEFT_SHM_SLOT_BYTES) must be between 1 and 4 GiB");
  }
  FifoLayout layout;
  layout.slots = static_cast<size_t>(slots);
  layout.headers = std::max(layout.slots, kLeastHeaders);
  layout.slot_bytes = slot_bytes;
  layout.stride = round_up(slot_bytes, kSlotAlign);
  layout.headers_offset = round_up(sizeof(FifoControl), kFifoAlign);
  layout.data_offset =
      round_up(layout.headers_offset + layout.headers * sizeof(SlotHeader), kSlotAlign);
  layout.total_bytes = layout.data_offset + layout.slots * layout.stride;
  return layout;
}

void init_fifo(void* base, const FifoLayout& layout) {
  auto* control = new (base) FifoControl{};
  control->info = FifoInfo{kFifoMagic,
                           kFifoVersion,
                           static_cast<uint32_t>(layout.slots),
                           static_cast<uint32_t>(layout.headers),
                           0,
                           layout.slot_bytes,
                           layout.total_bytes};
  control->head.store(0, std::memory_order_relaxed);
  control->tail.store(0, std::memory_order_relaxed);
  control->data_tail.store(0, std::memory_order_relaxed);
  control->sender_closed.store(0, std::memory_order_relaxed);
  control->receiver_closed.store(0, std::memory_order_relaxed);
  control->doorbell.rings.store(0, std::memory_order_relaxed);
  control->doorbell.sleepers.store(0, std::memory_order_relaxed);
  auto* headers = reinterpret_cast<SlotHeader*>(static_cast<char*>(base) + layout.headers_offset);
  for (size_t i = 0; i < layout.headers; ++i) new (&headers[i]) SlotHeader{};
}

const char* check_fifo(const void* base, const FifoLayout& layout) {
  const FifoInfo& info = static_cast<const FifoControl*>(base)->info;
  if (info.magic != kFifoMagic) return "not a weft FIFO";
  if (info.version != kFifoVersion) return "FIFO version differs";
  if (info.slots != layout.slots || info.headers != layout.headers ||
      info.slot_bytes != layout.slot_bytes) {
    return "slot count or size differs";
  }
  if (info.total_bytes != layout.total_bytes) return "segment size differs";
  return "";
}

}  // namespace weft::shm
