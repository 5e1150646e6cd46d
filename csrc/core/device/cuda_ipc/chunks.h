// The arithmetic of cuda_ipc's rounds: how many elements a round moves and
// which part of a round each rank owns. Plain C++ (no CUDA).
#pragma once

#include <algorithm>
#include <cstddef>

namespace weft::cuda_ipc {

// A range of elements.
struct Span {
  size_t begin = 0;
  size_t count = 0;
};

// Elements per block in one round when a round stages `blocks` blocks of
// `elem`-byte elements in at most `staging_bytes` (at least 1).
inline size_t round_elements(size_t staging_bytes, size_t elem, size_t blocks) {
  return std::max<size_t>(1, staging_bytes / (elem * blocks));
}

// Rounds of `step` elements (or bytes) that cover `count`.
inline size_t rounds(size_t count, size_t step) { return (count + step - 1) / step; }

// Part `i` of `parts` near-equal parts of `count` elements: the first
// count % parts parts have one element more.
inline Span part(size_t count, int parts, int i) {
  const size_t n = static_cast<size_t>(parts);
  const size_t k = static_cast<size_t>(i);
  const size_t base = count / n;
  const size_t extra = count % n;
  return Span{k * base + std::min(k, extra), base + (k < extra ? 1 : 0)};
}

}  // namespace weft::cuda_ipc
