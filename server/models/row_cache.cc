#include "temb/models/row_cache.h"

namespace temb::models {

RowCache::RowCache(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {
  stats_.capacity_bytes = capacity_bytes;
}

int64_t RowCache::EntryBytes(const Entry& entry) {
  return static_cast<int64_t>(entry.first.size() + entry.second->size());
}

std::shared_ptr<const std::string> RowCache::Find(const std::string& key) {
  absl::MutexLock lock(&mutex_);
  const auto it = index_.find(key);
  if (it == index_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  order_.splice(order_.begin(), order_, it->second);
  return it->second->second;
}

void RowCache::Insert(const std::string& key,
                      std::shared_ptr<const std::string> value) {
  absl::MutexLock lock(&mutex_);
  const auto it = index_.find(key);
  if (it != index_.end()) {
    stats_.bytes -= EntryBytes(*it->second);
    order_.erase(it->second);
    index_.erase(it);
    --stats_.entries;
  }
  Entry entry(key, std::move(value));
  if (EntryBytes(entry) > capacity_bytes_) return;
  stats_.bytes += EntryBytes(entry);
  ++stats_.entries;
  order_.push_front(std::move(entry));
  index_[key] = order_.begin();
  EvictLocked();
}

void RowCache::EvictLocked() {
  while (stats_.bytes > capacity_bytes_ && !order_.empty()) {
    const Entry& last = order_.back();
    stats_.bytes -= EntryBytes(last);
    index_.erase(last.first);
    order_.pop_back();
    --stats_.entries;
    ++stats_.evictions;
  }
}

RowCacheStats RowCache::stats() const {
  absl::MutexLock lock(&mutex_);
  return stats_;
}

}  // namespace temb::models
