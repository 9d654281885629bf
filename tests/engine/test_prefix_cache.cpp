#include <gtest/gtest.h>

#include "engine/prefix_cache.h"

namespace {

class FakeSnap : public lilac::SessionSnapshot {
 public:
  FakeSnap(int64_t len, size_t bytes) : len_(len), bytes_(bytes) {}
  int64_t length() const override { return len_; }
  size_t bytes() const override { return bytes_; }

 private:
  int64_t len_;
  size_t bytes_;
};

std::shared_ptr<const lilac::SessionSnapshot> snap(int64_t len, size_t bytes = 1000) {
  return std::make_shared<FakeSnap>(len, bytes);
}

std::vector<int32_t> seq(std::initializer_list<int32_t> v) { return v; }

}  // namespace

TEST(PrefixCache, LongestPrefixWins) {
  lilac::PrefixCache c(1 << 20);
  auto a = seq({1, 2, 3});
  auto b = seq({1, 2, 3, 4, 5});
  auto other = seq({1, 9, 9, 9, 9, 9});
  ASSERT_TRUE(c.insert(a, snap(3)));
  ASSERT_TRUE(c.insert(b, snap(5)));
  ASSERT_TRUE(c.insert(other, snap(6)));
  auto prompt = seq({1, 2, 3, 4, 5, 6, 7});
  auto hit = c.lookup(prompt, 100);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->length, 5);
  EXPECT_EQ(hit->snapshot->length(), 5);
  // Limited length: only the 3-token prefix qualifies.
  hit = c.lookup(prompt, 4);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->length, 3);
  // A prompt that diverges at token 2 gets nothing.
  auto diverging = seq({1, 5, 3, 4});
  EXPECT_FALSE(c.lookup(diverging, 100));
  // An entry longer than the prompt is never a prefix of it.
  auto shorter = seq({1, 2, 3, 4});
  hit = c.lookup(shorter, 100);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->length, 3);
  EXPECT_EQ(c.entries(), 3u);
}

TEST(PrefixCache, LruEvictionWithinBudget) {
  // Each entry costs its snapshot bytes plus 4 bytes per token.
  lilac::PrefixCache c(3000);
  auto a = seq({1}), b = seq({2}), d = seq({3}), e = seq({4});
  ASSERT_TRUE(c.insert(a, snap(1, 900)));
  ASSERT_TRUE(c.insert(b, snap(1, 900)));
  ASSERT_TRUE(c.insert(d, snap(1, 900)));
  EXPECT_EQ(c.entries(), 3u);
  EXPECT_EQ(c.bytes(), 3u * 904u);
  // Touch `a` so `b` is the least recently used.
  EXPECT_TRUE(c.contains(a));
  ASSERT_TRUE(c.insert(e, snap(1, 900)));
  EXPECT_EQ(c.entries(), 3u);
  EXPECT_TRUE(c.contains(a));
  EXPECT_FALSE(c.contains(b));
  EXPECT_TRUE(c.contains(d));
  EXPECT_TRUE(c.contains(e));
  EXPECT_LE(c.bytes(), c.max_bytes());
}

TEST(PrefixCache, OversizedSnapshotIsNotStoredAndReplaceKeepsAccounting) {
  lilac::PrefixCache c(1000);
  auto a = seq({1, 2});
  EXPECT_FALSE(c.insert(a, snap(2, 5000)));
  EXPECT_EQ(c.entries(), 0u);
  EXPECT_EQ(c.bytes(), 0u);
  ASSERT_TRUE(c.insert(a, snap(2, 100)));
  ASSERT_TRUE(c.insert(a, snap(2, 200)));  // same key: replaced, not duplicated
  EXPECT_EQ(c.entries(), 1u);
  EXPECT_EQ(c.bytes(), 208u);
  c.clear();
  EXPECT_EQ(c.entries(), 0u);
  EXPECT_EQ(c.bytes(), 0u);
  EXPECT_FALSE(c.lookup(a, 10));
}
