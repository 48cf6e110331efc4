// The paged KV cache of continuous batching: one pool of fixed-size blocks per tier (each
// block `block_rows` positions of every layer's K and V, in the batch state's caches), and a
// block table per sequence. A sequence grows by taking free blocks, never by copying rows;
// finishing or preemption returns its blocks. The engine thread alone uses it (no locking).
#pragma once
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace arbiter {

/// Positions per block (vLLM's default block size).
constexpr int kKvBlockRows = 16;

class KvPool {
 public:
  KvPool(int n_blocks, int block_rows) : block_rows_(block_rows), total_(n_blocks) {
    ARB_CHECK(n_blocks >= 1 && block_rows >= 1, "[kv] pool of %d blocks of %d rows", n_blocks,
              block_rows);
    // Handed out lowest id first: a run's block ids depend only on its order of requests.
    for (int b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
  }
  int block_rows() const { return block_rows_; }
  int total() const { return total_; }
  int free() const { return int(free_.size()); }
  /// Blocks that hold `positions` positions.
  int blocks_for(int positions) const { return (positions + block_rows_ - 1) / block_rows_; }
  /// Grows a block table to hold `positions` positions; false, the table unchanged, when the
  /// pool has too few free blocks.
  bool grow(std::vector<int32_t>& table, int positions) {
    const int need = blocks_for(positions) - int(table.size());
    if (need <= 0) return true;
    if (need > free()) return false;
    for (int k = 0; k < need; ++k) {
      table.push_back(free_.back());
      free_.pop_back();
    }
    return true;
  }
  /// Returns every block of the table to the pool and empties it.
  void release(std::vector<int32_t>& table) {
    for (auto it = table.rbegin(); it != table.rend(); ++it) free_.push_back(*it);
    table.clear();
  }

 private:
  int block_rows_, total_;
  std::vector<int32_t> free_;  // a stack: the next block handed out is free_.back()
};

}  // namespace arbiter
