// The exact row cache: hits, misses, byte accounting, LRU eviction.
#include "temb/models/row_cache.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace temb::models {
namespace {

std::shared_ptr<const std::string> Bytes(size_t n, char c) {
  return std::make_shared<const std::string>(n, c);
}

TEST(RowCacheTest, CountsHitsMissesAndBytes) {
  RowCache cache(1000);
  EXPECT_EQ(cache.Find("a"), nullptr);
  cache.Insert("a", Bytes(100, 'x'));
  auto hit = cache.Find("a");
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(*hit, std::string(100, 'x'));
  const RowCacheStats stats = cache.stats();
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 1);
  EXPECT_EQ(stats.entries, 1);
  EXPECT_EQ(stats.bytes, 101);  // key and value
  EXPECT_EQ(stats.capacity_bytes, 1000);
}

TEST(RowCacheTest, EvictsLeastRecentlyUsedWithinCapacity) {
  RowCache cache(300);
  cache.Insert("a", Bytes(99, 'a'));
  cache.Insert("b", Bytes(99, 'b'));
  cache.Insert("c", Bytes(99, 'c'));
  ASSERT_NE(cache.Find("a"), nullptr);  // a is now the most recent
  cache.Insert("d", Bytes(99, 'd'));    // evicts b, the least recent
  EXPECT_EQ(cache.Find("b"), nullptr);
  EXPECT_NE(cache.Find("a"), nullptr);
  EXPECT_NE(cache.Find("c"), nullptr);
  EXPECT_NE(cache.Find("d"), nullptr);
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_LE(cache.stats().bytes, 300);
}

TEST(RowCacheTest, ReplacesAndRefusesOversizedEntries) {
  RowCache cache(100);
  cache.Insert("a", Bytes(10, 'a'));
  cache.Insert("a", Bytes(20, 'b'));
  EXPECT_EQ(cache.stats().entries, 1);
  EXPECT_EQ(cache.stats().bytes, 21);
  cache.Insert("huge", Bytes(200, 'h'));
  EXPECT_EQ(cache.Find("huge"), nullptr);
  EXPECT_NE(cache.Find("a"), nullptr);  // not evicted for an entry never kept
}

}  // namespace
}  // namespace temb::models
