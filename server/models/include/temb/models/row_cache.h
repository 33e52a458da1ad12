// An exact cache of conditioning rows that depend on the timestep (and a
// scalar guidance) alone.  A key holds the model, the identity of its
// weights, the values cached and the exact bits of the row's inputs after
// the pipeline's rounding; an entry is the bytes of those values for that
// row.  A hit therefore returns exactly what computing would: the Linear
// kernel is batch-invariant (temb/kernels/linear.h), so a row computed
// alone and one computed among others are the same bits.
//
// Least-recently-used eviction keeps the bytes held (keys and values) at
// or below the capacity; an entry larger than the whole capacity is not
// kept.  Thread-safe.
#ifndef TEMB_MODELS_ROW_CACHE_H_
#define TEMB_MODELS_ROW_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace temb::models {

struct RowCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t entries = 0;
  int64_t bytes = 0;  // keys and values held now
  int64_t evictions = 0;
  int64_t capacity_bytes = 0;
};

class RowCache {
 public:
  explicit RowCache(int64_t capacity_bytes);

  // The entry for `key` (made most recent), or nullptr; counts a hit or a
  // miss.
  std::shared_ptr<const std::string> Find(const std::string& key);
  // Stores `value` under `key` (replacing an older one), then evicts the
  // least recently used entries until the bytes held fit the capacity.
  void Insert(const std::string& key, std::shared_ptr<const std::string> value);

  RowCacheStats stats() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const std::string>>;
  static int64_t EntryBytes(const Entry& entry);
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const int64_t capacity_bytes_;
  mutable absl::Mutex mutex_;
  std::list<Entry> order_ ABSL_GUARDED_BY(mutex_);  // most recent first
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_
      ABSL_GUARDED_BY(mutex_);
  RowCacheStats stats_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace temb::models

#endif  // TEMB_MODELS_ROW_CACHE_H_
