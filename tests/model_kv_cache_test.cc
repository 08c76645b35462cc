#include <cmath>
#include <vector>

#include "common/model/kv_cache.h"
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
      const std::vector<float> keys(kKvDim, Tag(layer, slot, false));
      const std::vector<float> values(kKvDim, Tag(layer, slot, true));
      cache.StoreRows(layer, slot, 1, keys.data(), values.data());
    }
  }
}

// Slot `slot` holds what FillSlots wrote to `original_slot`.
void ExpectSlotHolds(const KvCache& cache, int64_t slot, int64_t original_slot) {
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    std::vector<float> keys(kKvDim), values(kKvDim);
    cache.ReadKeys(layer, slot, 1, keys.data());
    cache.ReadValues(layer, slot, 1, values.data());
    for (int64_t d = 0; d < kKvDim; ++d) {
      EXPECT_EQ(keys[d], Tag(layer, original_slot, false)) << "layer " << layer << " slot " << slot;
      EXPECT_EQ(values[d], Tag(layer, original_slot, true))
          << "layer " << layer << " slot " << slot;
    }
  }
}

KvCache MakeCache() {
  auto cache = KvCache::Create(kLayers, kKvDim, kCapacity);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(*cache);
}

// What a cache allocates: keys and values per layer and slot in its type (f32 4 bytes, f16 2,
// q8_0 34 per 32 elements), an i32 position per slot.
TEST(KvCacheTest, BytesAreWhatTheCacheHolds) {
  const std::vector<int64_t> smollm(30, 192);
  EXPECT_EQ(KvCacheBytes(smollm, 2048, KvType::kF32),
            2u * 30 * 2048 * 192 * 4 + 2048 * 4);  // 94,380,032
  EXPECT_EQ(KvCacheBytes(smollm, 2048, KvType::kF16), 2u * 30 * 2048 * 192 * 2 + 2048 * 4);
  EXPECT_EQ(KvCacheBytes(smollm, 2048, KvType::kQ8_0), 2u * 30 * 2048 * (192 / 32) * 34 + 2048 * 4);
  for (const KvType type : {KvType::kF32, KvType::kF16, KvType::kQ8_0}) {
    auto cache = KvCache::Create(3, 64, 7, type);
    ASSERT_TRUE(cache.ok());
    EXPECT_EQ(cache->type(), type);
    const uint64_t layer_bytes = static_cast<uint64_t>(cache->keys(1).data - cache->keys(0).data);
    EXPECT_EQ(layer_bytes, 7u * static_cast<uint64_t>(cache->row_bytes(0)));
    EXPECT_EQ(KvCacheBytes({64, 64, 64}, 7, type), 2 * layer_bytes * 3 + 7 * sizeof(int32_t));
  }
}

// q8_0 rows are whole blocks of 32: other widths are refused, by width or by head.
TEST(KvCacheTest, Q8CachesNeedWholeBlocks) {
  const absl::StatusOr<KvCache> narrow = KvCache::Create(2, 48, 4, KvType::kQ8_0);
  EXPECT_EQ(narrow.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(narrow.status().message().find("multiples of 32"), absl::string_view::npos);
  ModelConfig config;
  config.num_layers = 2;
  config.d_model = 64;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 16;  // kv_dim 32, but each head is half a block
  const absl::StatusOr<KvCache> by_head = KvCache::Create(config, 4, KvType::kQ8_0);
  EXPECT_EQ(by_head.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(by_head.status().message().find("16 wide"), absl::string_view::npos)
      << by_head.status();
  EXPECT_TRUE(KvCache::Create(config, 4, KvType::kF16).ok());
}

// Layers of different widths (gemma4's global and local layers): each layer's storage is
// capacity x its own width, back to back, and a commit moves every layer's slot by its width.
TEST(KvCacheTest, LayersOfDifferentWidths) {
  auto cache = KvCache::Create(std::vector<int64_t>{4, 2, 6}, 5);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ(cache->kv_dim(1), 2);
  EXPECT_EQ(cache->keys(1).data - cache->keys(0).data, 5 * 4 * 4);
  EXPECT_EQ(cache->keys(2).data - cache->keys(1).data, 5 * 2 * 4);
  EXPECT_EQ(KvCacheBytes({4, 2, 6}, 5, KvType::kF32), 2u * 5 * (4 + 2 + 6) * 4 + 5 * 4);
  ASSERT_TRUE(cache->BeginPending(3).ok());
  for (int64_t layer = 0; layer < 3; ++layer) {
    const int64_t width = cache->kv_dim(layer);
    std::vector<float> keys(3 * width), values(3 * width);
    for (int64_t i = 0; i < 3 * width; ++i) {
      keys[i] = static_cast<float>(100 * layer + i);
      values[i] = static_cast<float>(-100 * layer - i);
    }
    cache->StoreRows(layer, 0, 3, keys.data(), values.data());
  }
  const int32_t keep[] = {2};  // pending slot 2 becomes slot 0
  ASSERT_TRUE(cache->CommitSlots(keep).ok());
  for (int64_t layer = 0; layer < 3; ++layer) {
    const int64_t width = cache->kv_dim(layer);
    std::vector<float> keys(width), values(width);
    cache->ReadKeys(layer, 0, 1, keys.data());
    cache->ReadValues(layer, 0, 1, values.data());
    for (int64_t i = 0; i < width; ++i) {
      EXPECT_EQ(keys[i], static_cast<float>(100 * layer + 2 * width + i));
      EXPECT_EQ(values[i], static_cast<float>(-100 * layer - 2 * width - i));
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

// An f16 cache holds the nearest half of what was stored (ties to even, overflow to infinity,
// underflow to zero), in the slots and layer it was stored to only; commits move encoded rows.
TEST(KvCacheTest, F16CacheHoldsTheNearestHalf) {
  auto cache = KvCache::Create(kLayers, kKvDim, kCapacity, KvType::kF16);
  ASSERT_TRUE(cache.ok());
  // 1 + 2^-12 is halfway between two fp16 values (ties to even: 1); 1 + 3 * 2^-12 rounds up to
  // 1 + 2^-10; 70000 overflows fp16 to infinity; 1e-8 underflows to zero.
  const float inputs[2 * kKvDim] = {
      1.0f + 0x1.0p-12f, 1.0f + 3 * 0x1.0p-12f, 70000.0f, 1e-8f, 0.5f, -2.0f, 3.0f, 0.25f};
  const float expected[2 * kKvDim] = {1.0f, 1.0f + 0x1.0p-10f, INFINITY, 0.0f, 0.5f, -2.0f, 3.0f,
                                      0.25f};
  const std::vector<float> negated = {-inputs[0], -inputs[1], -inputs[2], -inputs[3],
                                      -inputs[4], -inputs[5], -inputs[6], -inputs[7]};
  FillSlots(*cache, 0, kCapacity);
  ASSERT_TRUE(cache->BeginPending(2).ok());
  cache->StoreRows(1, 0, 2, inputs, negated.data());  // layer 1, slots 0 and 1
  const int32_t keep[] = {1};
  ASSERT_TRUE(cache->CommitSlots(keep).ok());  // pending slot 1 becomes slot 0
  std::vector<float> keys(kKvDim), values(kKvDim);
  cache->ReadKeys(1, 0, 1, keys.data());
  cache->ReadValues(1, 0, 1, values.data());
  for (int64_t d = 0; d < kKvDim; ++d) {
    EXPECT_EQ(keys[d], expected[kKvDim + d]) << d;
    EXPECT_EQ(values[d], -expected[kKvDim + d]) << d;
  }
  // Layer 0's slot 0 now holds what FillSlots wrote to slot 1 (a whole half).
  cache->ReadKeys(0, 0, 1, keys.data());
  EXPECT_EQ(keys[0], Tag(0, 1, false));
  cache->StoreRows(1, 2, 1, inputs, negated.data());
  cache->ReadKeys(1, 2, 1, keys.data());
  for (int64_t d = 0; d < kKvDim; ++d) EXPECT_EQ(keys[d], expected[d]) << d;
}

}  // namespace
}  // namespace bitsplit::model
