#include <cmath>
#include <vector>

#include "common/model/kv_cache.h"
#include "common/util/fp16.h"
#include "gtest/gtest.h"

namespace bitsplit::model {
namespace {

constexpr int64_t kLayers = 3;
constexpr int64_t kKvDim = 4;
constexpr int64_t kCapacity = 10;

// Distinct contents for (layer, slot, key/value), so moves are traceable.
float Tag(int64_t layer, int64_t slot, bool value) {
  return static_cast<float>(layer * 1000 + slot * 10 + (value ? 1 : 0));
}

void FillSlots(KvCache& cache, int64_t first, int64_t count) {
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    for (int64_t slot = first; slot < first + count; ++slot) {
      for (int64_t d = 0; d < kKvDim; ++d) {
        cache.keys(layer)[slot * kKvDim + d] = Tag(layer, slot, false);
        cache.values(layer)[slot * kKvDim + d] = Tag(layer, slot, true);
      }
    }
  }
}

// Slot `slot` holds what FillSlots wrote to `original_slot`.
void ExpectSlotHolds(const KvCache& cache, int64_t slot, int64_t original_slot) {
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    for (int64_t d = 0; d < kKvDim; ++d) {
      EXPECT_EQ(cache.keys(layer)[slot * kKvDim + d], Tag(layer, original_slot, false))
          << "layer " << layer << " slot " << slot;
      EXPECT_EQ(cache.values(layer)[slot * kKvDim + d], Tag(layer, original_slot, true))
          << "layer " << layer << " slot " << slot;
    }
  }
}

KvCache MakeCache() {
  auto cache = KvCache::Create(kLayers, kKvDim, kCapacity);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(*cache);
}

// What a cache allocates: f32 keys and values per layer and slot, an i32 position per slot.
TEST(KvCacheTest, BytesAreWhatTheCacheHolds) {
  EXPECT_EQ(KvCacheBytes(std::vector<int64_t>(30, 192), 2048),
            2u * 30 * 2048 * 192 * 4 + 2048 * 4);  // 94,380,032
  auto cache = KvCache::Create(3, 5, 7);
  ASSERT_TRUE(cache.ok());
  const uint64_t held =
      2 * static_cast<uint64_t>(cache->keys(1) - cache->keys(0)) * 3 * sizeof(float) +
      7 * sizeof(int32_t);
  EXPECT_EQ(KvCacheBytes({5, 5, 5}, 7), held);
}

// Layers of different widths (gemma4's global and local layers): each layer's storage is
// capacity x its own width, back to back, and a commit moves every layer's slot by its width.
TEST(KvCacheTest, LayersOfDifferentWidths) {
  auto cache = KvCache::Create(std::vector<int64_t>{4, 2, 6}, 5);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ(cache->kv_dim(1), 2);
  EXPECT_EQ(cache->keys(1) - cache->keys(0), 5 * 4);
  EXPECT_EQ(cache->keys(2) - cache->keys(1), 5 * 2);
  EXPECT_EQ(KvCacheBytes({4, 2, 6}, 5), 2u * 5 * (4 + 2 + 6) * 4 + 5 * 4);
  ASSERT_TRUE(cache->BeginPending(3).ok());
  for (int64_t layer = 0; layer < 3; ++layer) {
    const int64_t width = cache->kv_dim(layer);
    for (int64_t i = 0; i < 3 * width; ++i) {
      cache->keys(layer)[i] = static_cast<float>(100 * layer + i);
      cache->values(layer)[i] = static_cast<float>(-100 * layer - i);
    }
  }
  const int32_t keep[] = {2};  // pending slot 2 becomes slot 0
  ASSERT_TRUE(cache->CommitSlots(keep).ok());
  for (int64_t layer = 0; layer < 3; ++layer) {
    const int64_t width = cache->kv_dim(layer);
    for (int64_t i = 0; i < width; ++i) {
      EXPECT_EQ(cache->keys(layer)[i], static_cast<float>(100 * layer + 2 * width + i));
      EXPECT_EQ(cache->values(layer)[i], static_cast<float>(-100 * layer - 2 * width - i));
    }
  }
  EXPECT_FALSE(KvCache::Create(std::vector<int64_t>{4, 0}, 5).ok());
}

TEST(KvCacheTest, SessionsThatFitABudget) {
  auto three = SessionsThatFit(3 * 1000 + 999, 1000, 256, "a session");
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(*three, 3);
  auto capped = SessionsThatFit(1'000'000, 1000, 8, "a session");
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(*capped, 8);
  auto none = SessionsThatFit(512 << 10, 1 << 20, 8, "a session of 256 tokens");
  ASSERT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(none.status().message(),
            "a session of 256 tokens holds 1.0 MiB of KV cache; the budget of 0.5 MiB holds none");
  // Half of what is available once the unlocked weights are taken out; nothing when they take
  // all of it (10.3 GB of mapped weights counted as available page cache).
  EXPECT_EQ(DefaultKvRamBudget(10'000, 0), 5'000u);
  EXPECT_EQ(DefaultKvRamBudget(10'000, 4'000), 3'000u);
  EXPECT_EQ(DefaultKvRamBudget(10'000, 10'000), 0u);
  EXPECT_EQ(DefaultKvRamBudget(10'000, 12'000), 0u);
}

TEST(KvCacheTest, RejectsNonPositiveSizes) {
  EXPECT_EQ(KvCache::Create(0, 4, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::Create(1, 0, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::Create(1, 4, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::Create(1 << 20, 1 << 20, 1 << 20).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(KvCacheTest, CommitKeepsAPrefixOfThePendingSlots) {
  KvCache cache = MakeCache();
  ASSERT_TRUE(cache.BeginPending(4).ok());
  EXPECT_EQ(cache.pending_length(), 4);
  ASSERT_TRUE(cache.Commit(2).ok());
  EXPECT_EQ(cache.committed_length(), 2);
  EXPECT_EQ(cache.pending_length(), 0);
  ASSERT_TRUE(cache.BeginPending(3).ok());
  ASSERT_TRUE(cache.Commit(3).ok());
  EXPECT_EQ(cache.committed_length(), 5);
}

TEST(KvCacheTest, CommitMoreThanPendingFails) {
  KvCache cache = MakeCache();
  ASSERT_TRUE(cache.BeginPending(2).ok());
  const absl::Status status = cache.Commit(3);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("only 2 are pending"), std::string::npos) << status;
  EXPECT_EQ(cache.committed_length(), 0);
  EXPECT_EQ(cache.Commit(-1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvCacheTest, BeginPendingBeyondCapacityIsResourceExhausted) {
  KvCache cache = MakeCache();
  ASSERT_TRUE(cache.BeginPending(8).ok());
  ASSERT_TRUE(cache.Commit(8).ok());
  const absl::Status status = cache.BeginPending(3);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("capacity of 10"), std::string::npos) << status;
  EXPECT_TRUE(cache.BeginPending(2).ok());
}

TEST(KvCacheTest, CommitSlotsCompactsChosenSlotsInOrder) {
  KvCache cache = MakeCache();
  FillSlots(cache, 0, kCapacity);
  ASSERT_TRUE(cache.BeginPending(2).ok());
  ASSERT_TRUE(cache.Commit(2).ok());
  ASSERT_TRUE(cache.BeginPending(6).ok());  // pending slots 2..7
  const std::vector<int32_t> accepted = {0, 2, 3, 5};
  ASSERT_TRUE(cache.CommitSlots(accepted).ok());
  EXPECT_EQ(cache.committed_length(), 6);
  EXPECT_EQ(cache.pending_length(), 0);
  ExpectSlotHolds(cache, 0, 0);  // committed prefix untouched
  ExpectSlotHolds(cache, 1, 1);
  ExpectSlotHolds(cache, 2, 2);  // pending index 0 stays in place
  ExpectSlotHolds(cache, 3, 4);  // pending index 2
  ExpectSlotHolds(cache, 4, 5);  // pending index 3
  ExpectSlotHolds(cache, 5, 7);  // pending index 5
}

TEST(KvCacheTest, CommitSlotsWithNothingAcceptedDropsThePending) {
  KvCache cache = MakeCache();
  ASSERT_TRUE(cache.BeginPending(3).ok());
  ASSERT_TRUE(cache.CommitSlots({}).ok());
  EXPECT_EQ(cache.committed_length(), 0);
  EXPECT_EQ(cache.pending_length(), 0);
}

TEST(KvCacheTest, CommitSlotsRejectsBadIndicesWithoutChangingAnything) {
  KvCache cache = MakeCache();
  FillSlots(cache, 0, kCapacity);
  ASSERT_TRUE(cache.BeginPending(4).ok());
  for (const std::vector<int32_t>& bad :
       {std::vector<int32_t>{1, 1}, {2, 1}, {0, 4}, {-1}, {0, 1, 2, 3, 4}}) {
    const absl::Status status = cache.CommitSlots(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad.size();
    EXPECT_EQ(cache.committed_length(), 0);
    EXPECT_EQ(cache.pending_length(), 4);
  }
  for (int64_t slot = 0; slot < kCapacity; ++slot) ExpectSlotHolds(cache, slot, slot);
}

TEST(KvCacheTest, DiscardAndClear) {
  KvCache cache = MakeCache();
  ASSERT_TRUE(cache.BeginPending(3).ok());
  cache.DiscardPending();
  EXPECT_EQ(cache.pending_length(), 0);
  EXPECT_FALSE(cache.Commit(1).ok());
  ASSERT_TRUE(cache.BeginPending(3).ok());
  ASSERT_TRUE(cache.Commit(3).ok());
  cache.Clear();
  EXPECT_EQ(cache.committed_length(), 0);
  EXPECT_TRUE(cache.BeginPending(kCapacity).ok());
}

TEST(KvCacheTest, Fp16RoundingRoundsTheGivenSlotsOfOneLayerOnly) {
  auto rounded = KvCache::Create(kLayers, kKvDim, kCapacity, KvRounding::kFp16);
  auto exact = KvCache::Create(kLayers, kKvDim, kCapacity);
  ASSERT_TRUE(rounded.ok() && exact.ok());
  EXPECT_EQ(rounded->rounding(), KvRounding::kFp16);
  EXPECT_EQ(exact->rounding(), KvRounding::kNone);
  // 1 + 2^-12 is halfway between two fp16 values (ties to even: 1); 1 + 3 * 2^-12 rounds up to
  // 1 + 2^-10; 70000 overflows fp16 to infinity; 1e-8 underflows to zero.
  const float inputs[kKvDim] = {1.0f + 0x1.0p-12f, 1.0f + 3 * 0x1.0p-12f, 70000.0f, 1e-8f};
  const float expected[kKvDim] = {1.0f, 1.0f + 0x1.0p-10f, INFINITY, 0.0f};
  for (KvCache* cache : {&*rounded, &*exact}) {
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      for (int64_t slot = 0; slot < kCapacity; ++slot) {
        for (int64_t d = 0; d < kKvDim; ++d) {
          cache->keys(layer)[slot * kKvDim + d] = inputs[d];
          cache->values(layer)[slot * kKvDim + d] = -inputs[d];
        }
      }
    }
    cache->RoundStored(1, 3, 2);  // layer 1, slots 3 and 4
  }
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    for (int64_t slot = 0; slot < kCapacity; ++slot) {
      const bool touched = layer == 1 && (slot == 3 || slot == 4);
      for (int64_t d = 0; d < kKvDim; ++d) {
        const float want = touched ? expected[d] : inputs[d];
        EXPECT_EQ(rounded->keys(layer)[slot * kKvDim + d], want) << layer << " " << slot;
        EXPECT_EQ(rounded->values(layer)[slot * kKvDim + d], -want) << layer << " " << slot;
        EXPECT_EQ(exact->keys(layer)[slot * kKvDim + d], inputs[d]);
        EXPECT_EQ(exact->values(layer)[slot * kKvDim + d], -inputs[d]);
      }
    }
  }
}

}  // namespace
}  // namespace bitsplit::model
