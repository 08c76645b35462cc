#pragma once
// The CUDA drafter backend's engine: a split model's base weights in VRAM, every session's fp16
// KV cache on the device, and LlamaModel::Forward's contract (draft and verify modes) run by the
// kernels of kernels.h. In verify mode every linear group's residual half goes to a
// model::ResidualSource (cpu-residual through shared memory, or in process) and overlaps with the
// base matmul on the GPU:
//
//   GPU stream:  rotate, quantize -> copy activations to host -> base matmul -> .. -> add residual
//   host:                          wait for the copy -> Submit + Accumulate (CPU residual) -> copy
//                                                       the residual's output to the device
//
// so the base matmul is queued before the host starts waiting for the residual. The residual's
// output is added on the device with the same single f32 addition as the CPU path.
//
// A mixture-of-experts layer routes on the host, with the CPU forward's own functions
// (model::RouteRows, model::GroupByExpert): the router's logits are computed on the device (the
// CPU's bit for bit from the same input), copied back (the host waits for them), and the routing
// tables go back to the device. Every routed pair's input row is gathered, rotated and quantized
// once; each routed expert's base slice then runs on its rows (one matmul per expert and group),
// and in verify mode the residual of all of them is one ResidualSource::AccumulateExperts call,
// which reads each routed expert's residual once. Because of the host's routing step between
// kernels, such a model's draft forwards launch kernel by kernel (no CUDA graphs).
//
// Memory is placed by the VRAM plan (common/model/vram_plan.h): Create refuses, with the plan's
// RESOURCE_EXHAUSTED message, when the model, `sessions` KV caches of `context` tokens and the
// scratch of a `max_batch_rows` forward do not fit the budget.
//
// Thread safety: none; one forward at a time (the drafter serializes its engine).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda/kernels.h"
#include "common/model/config.h"
#include "common/model/kv_cache.h"
#include "common/model/llama_model.h"
#include "common/model/sampler.h"
#include "common/model/split_backend.h"
#include "common/model/split_model.h"
#include "common/model/vram_plan.h"
#include "common/model/weights.h"
#include "common/speculation/tree.h"
#include "common/util/thread_pool.h"

namespace bitsplit::cuda {

struct CudaModelOptions {
  int device = 0;
  int64_t context = 2048;       // tokens per session: every KV cache's capacity
  int64_t sessions = 1;         // KV caches that may exist at once; 0: as many as the budget
                                // holds, at most max_sessions
  int64_t max_sessions = 256;   // the bound of sessions = 0
  int64_t max_batch_rows = 64;  // largest forward: tree nodes + 1, prefill chunk
  uint64_t vram_budget = 0;     // 0: model::DefaultVramBudget(free device memory)
  int host_threads = 0;         // threads of an in-process residual (<= 0: every hardware thread)
  model::KvType kv_type = model::KvType::kF16;  // every KV cache's rows: f16 or q8_0
};

// Where one verify forward's time went (host clock and CUDA events).
struct ForwardTimings {
  int64_t total_ns = 0;              // Forward, from call to logits on the device
  int64_t residual_ns = 0;           // host inside the residual (Submit + Accumulate), all groups
  int64_t wait_gpu_ns = 0;           // host blocked on the device (activation copies, final sync)
  int64_t gpu_idle_residual_ns = 0;  // device idle between a base matmul and its residual's add
  int64_t groups = 0;                // linear groups run
};

class CudaModel;

// The kernels' description of split matrix `view` whose rows were copied to `data` on the device,
// `stride` bytes apart (the format's layout: code, scale and min offsets and strides).
kernels::DeviceMatrix DeviceMatrixOf(const quant::MatrixView& view, const uint8_t* data,
                                     int64_t stride);

// cos and sin of every RoPE pair for positions [0, positions): [positions][rotary_dims / 2] cos,
// then the same for sin, from ops::RopeCosSin (the CPU's own arithmetic, YaRN included), so the
// device rotates exactly as the CPU does. `rope`: a layer's (ModelConfig::LayerRope).
std::vector<float> RopeTable(const ops::RopeConfig& rope, int64_t positions);

// One session's KV cache in device memory, rows of f16 or q8_0 (the model's kv_type),
// [layer][slot][a row of the layer's kv_dim values] for keys and values (layer after layer, each
// at its own width), with
// model::KvCache's committed / pending bookkeeping and errors; for a sliding-window model also
// each slot's position (int32 [capacity], as KvCache::positions: what the window compares).
// Must not outlive its CudaModel.
class DeviceKvCache {
 public:
  ~DeviceKvCache();
  DeviceKvCache(const DeviceKvCache&) = delete;
  DeviceKvCache& operator=(const DeviceKvCache&) = delete;

  int64_t num_layers() const { return num_layers_; }
  int64_t kv_dim(int64_t layer) const { return layer_kv_dims_[static_cast<size_t>(layer)]; }
  int64_t capacity() const { return capacity_; }
  int64_t committed_length() const { return slots_.committed_length(); }
  int64_t pending_length() const { return slots_.pending_length(); }
  model::KvType type() const { return type_; }
  kernels::KvStorage storage() const {
    return type_ == model::KvType::kQ8_0 ? kernels::KvStorage::kQ8_0 : kernels::KvStorage::kF16;
  }
  int64_t row_bytes(int64_t layer) const { return ops::KvRowBytes(type_, kv_dim(layer)); }
  uint8_t* keys(int64_t layer) const { return keys_ + layer_offsets_[static_cast<size_t>(layer)]; }
  uint8_t* values(int64_t layer) const {
    return values_ + layer_offsets_[static_cast<size_t>(layer)];
  }
  // Device memory; null unless the model has a sliding window.
  int32_t* positions() const { return positions_; }

  absl::Status BeginPending(int64_t count) { return slots_.BeginPending(count); }
  absl::Status Commit(int64_t count) { return slots_.Commit(count); }
  // Moves the pending slots `pending_indices` (strictly ascending) to committed_length, ...: on
  // the model's stream, before any later forward.
  absl::Status CommitSlots(std::span<const int32_t> pending_indices);
  void DiscardPending() { slots_.DiscardPending(); }
  absl::Status Truncate(int64_t length) { return slots_.Truncate(length); }
  void Clear() { slots_.Clear(); }

  // Copies slots [first, first + count) of `layer` to the host as f32 (keys, then values; for
  // tests).
  absl::Status CopyToHost(int64_t layer, int64_t first, int64_t count, std::vector<float>* keys,
                          std::vector<float>* values) const;
  // The positions of slots [first, first + count) (for tests; FAILED_PRECONDITION without).
  absl::Status CopyPositionsToHost(int64_t first, int64_t count,
                                   std::vector<int32_t>* positions) const;

 private:
  friend class CudaModel;
  DeviceKvCache() = default;

  CudaModel* model_ = nullptr;
  void* slab_ = nullptr;
  uint8_t* keys_ = nullptr;
  uint8_t* values_ = nullptr;
  int32_t* positions_ = nullptr;
  model::KvType type_ = model::KvType::kF16;
  int64_t num_layers_ = 0;
  std::vector<int64_t> layer_kv_dims_;  // [layer]
  std::vector<int64_t> layer_offsets_;  // [layer]: bytes into one side
  int64_t capacity_ = 0;
  model::KvSlotLedger slots_;
};

// One sequence of a forward over many (CudaModel::ForwardSequences).
struct DeviceSequence {
  const model::Batch* batch = nullptr;
  DeviceKvCache* cache = nullptr;
};

// The draft children of one forward's logit rows (TopK).
using RowTopK = speculation::DraftRowChoices;  // common/speculation/tree.h

class CudaModel {
 public:
  // The base weights, embedding table and norms of `files` go to the device (`files` may be
  // closed afterwards; the residual, if any, is not used: see SetResidualSource).
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const model::SplitModelFiles& files,
                                                           const CudaModelOptions& options);
  // The same from views (e.g. a synthetic model built in memory).
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(
      const model::ModelConfig& config, const model::EmbeddingAndNorms& embedding_and_norms,
      const model::SplitLinearWeights& base, const model::SplitQuantization& quantization,
      const CudaModelOptions& options);
  ~CudaModel();

  const model::ModelConfig& config() const { return config_; }
  const model::VramPlan& plan() const { return plan_; }
  const CudaModelOptions& options() const { return options_; }
  const std::string& device_name() const { return device_name_; }
  cudaStream_t stream() const { return stream_; }
  bool embedding_on_device() const { return embedding_on_device_; }

  // The residual of verify mode (must outlive its use, or be replaced first: replacing it
  // unregisters its staging memory); nullptr removes verify mode. A source with staging memory
  // (model::ResidualStaging) gets the activations copied straight into it and its output copied
  // straight from it, by DMA: the memory is registered with cudaHostRegister at the first
  // verify forward.
  void SetResidualSource(model::ResidualSource* source);
  // After a verify forward: whether the source had staging memory, and whether it is registered
  // for DMA (memory that cannot be registered still works, through the driver's staging).
  bool residual_staging() const { return staging_ != nullptr; }
  bool residual_staging_registered() const { return staging_registered_; }
  bool has_residual() const { return residual_ != nullptr; }

  // A cache of options().context tokens. RESOURCE_EXHAUSTED when options().sessions caches
  // exist already (the plan has room for that many). A cache may be destroyed on any thread,
  // also while another thread calls this.
  absl::StatusOr<std::unique_ptr<DeviceKvCache>> NewKvCache();

  // LlamaModel::Forward's contract in draft or verify mode (reference: FAILED_PRECONDITION),
  // with the limits of this model's plan: at most max_batch_rows tokens, a mask at most twice
  // that wide, positions below options().context (INVALID_ARGUMENT otherwise). The logits of the
  // selected rows stay on the device for ChooseTargets / TopK / CopyLogits.
  absl::Status Forward(const model::Batch& batch, DeviceKvCache& cache, model::ForwardMode mode);
  // The same, then the logits to the host ([num_logit_rows, vocab]).
  absl::Status Forward(const model::Batch& batch, DeviceKvCache& cache, std::span<float> logits,
                       model::ForwardMode mode);
  // One forward over several sequences, each with its own KV cache (all distinct), positions and
  // mask: every linear group runs on all the sequences' rows at once (one residual request per
  // group in verify mode), attention on each sequence's own cache. Together at most
  // max_batch_rows rows and logit rows; the logit rows are the sequences' in order. Every row's
  // result is the one its sequence's own Forward gives (the kernels are batch-invariant).
  absl::Status ForwardSequences(std::span<const DeviceSequence> sequences, model::ForwardMode mode);

  // Of the last forward's logit rows: Sampler::Choose per row (greedy or sampled; positions[r] is
  // the sequence index row r's token takes), the top-k children (k <= 64), or the logits.
  absl::StatusOr<std::vector<int32_t>> ChooseTargets(const model::SamplingParams& sampling,
                                                     std::span<const int64_t> positions);
  absl::StatusOr<RowTopK> TopK(int32_t k);
  absl::Status CopyLogits(std::span<float> logits);
  // The same for logit rows [first_row, first_row + rows) only (one sequence of
  // ForwardSequences); rows = positions.size() for ChooseTargets.
  absl::StatusOr<std::vector<int32_t>> ChooseTargets(const model::SamplingParams& sampling,
                                                     std::span<const int64_t> positions,
                                                     int64_t first_row);
  absl::StatusOr<RowTopK> TopK(int32_t k, int64_t first_row, int64_t rows);
  absl::Status CopyLogits(int64_t first_row, int64_t rows, std::span<float> logits);
  int64_t last_logit_rows() const { return last_logit_rows_; }

  const ForwardTimings& last_timings() const { return timings_; }

  // Draft forwards of one sequence replay CUDA graphs, one captured per shape (rows, mask width,
  // logit rows, KV cache), when the embedding is gathered on the device (several sequences
  // launch their kernels one by one); verify forwards, which wait for the
  // host's residual between kernels, and a mixture-of-experts model's forwards, which route on
  // the host, launch their kernels one by one. On by default; off gives the same bits (for tests
  // and benchmarks).
  void set_cuda_graphs(bool on) { cuda_graphs_ = on; }
  bool cuda_graphs() const { return cuda_graphs_; }
  int64_t graphs_captured() const { return graphs_captured_; }
  int64_t graph_launches() const { return graph_launches_; }

  // For benchmarks: the base matmuls of one forward alone (every linear group and the head, on
  // `rows` activation rows of zeros, no rotation, quantization or residual; for an expert group
  // the slices of k experts, each on all rows), timed by CUDA events over `repetitions` passes.
  // Also the bytes of weights one pass reads.
  struct MatMulPassTiming {
    double ms = 0;
    uint64_t weight_bytes = 0;
  };
  absl::StatusOr<MatMulPassTiming> TimeBaseMatMuls(int64_t rows, int repetitions);

 private:
  friend class DeviceKvCache;
  struct Group {
    kernels::GroupMatMul matmul;  // outputs filled per call
    int64_t cols = 0;
    int64_t output_rows[kernels::kMaxGroupMatrices] = {};
  };

  // What a captured draft forward depends on besides device memory contents.
  struct ForwardShape {
    int64_t rows = 0;
    int64_t mask_width = 0;
    int64_t logit_rows = 0;
    bool selects_rows = false;            // batch.logit_rows given (else every row)
    const uint8_t* cache_keys = nullptr;  // identifies the KV cache (all have one layout)
    bool operator==(const ForwardShape&) const = default;
  };
  // Where one sequence's rows are in the forward's scratch.
  struct SequenceSlice {
    DeviceKvCache* cache = nullptr;
    int64_t first_row = 0;
    int64_t rows = 0;
    int64_t mask_width = 0;
    int64_t mask_offset = 0;  // bytes into the mask
  };
  struct CapturedForward {
    ForwardShape shape;
    cudaGraphExec_t exec = nullptr;
    int64_t groups = 0;
  };
  static constexpr size_t kMaxCapturedForwards = 32;

  CudaModel() = default;
  absl::Status Init(const model::ModelConfig& config,
                    const model::EmbeddingAndNorms& embedding_and_norms,
                    const model::SplitLinearWeights& base,
                    const model::SplitQuantization& quantization, const CudaModelOptions& options);
  // Init's steps, in order: the device and its free memory; the VRAM plan (and whether the
  // embedding table goes to the device); the base weights; embedding, norms, routers, RoPE
  // tables and Hadamard signs; the forward's scratch; the pinned host staging.
  absl::Status SelectDevice(size_t* free_bytes);
  absl::Status PlanMemory(const model::EmbeddingAndNorms& embedding_and_norms, size_t free_bytes);
  absl::Status UploadBaseWeights(const model::SplitLinearWeights& base);
  absl::Status UploadConstants(const model::EmbeddingAndNorms& embedding_and_norms);
  absl::Status CarveScratch();
  absl::Status AllocatePinnedStaging();
  absl::Status ValidateBatch(const model::Batch& batch, const DeviceKvCache& cache) const;
  absl::Status ForwardImpl(std::span<const DeviceSequence> sequences, model::ForwardMode mode);
  // Checks the logit rows [first_row, first_row + rows) of the last forward.
  absl::Status CheckLogitRows(int64_t first_row, int64_t rows) const;
  // Resolves (and registers) the residual source's staging memory once per source.
  absl::Status EnsureResidualStaging();
  // Every copy and kernel of one forward, on stream_ (the batch is in the pinned staging;
  // `shape` gives the totals over the slices).
  absl::Status EnqueueForward(const ForwardShape& shape, std::span<const SequenceSlice> slices,
                              bool verify);
  // The blocks of EnqueueForward, in the order it runs them, each queued on stream_
  // (LlamaModel's forward has the same blocks under the same names; UploadBatch is the device's
  // own). A ForwardPass holds one forward's totals, its sequences' slices and its mode.
  struct ForwardPass {
    int64_t rows = 0;  // every sequence's
    int64_t logit_rows = 0;
    bool selects_rows = false;  // d_.logit_rows lists them (else every row, in order)
    std::span<const SequenceSlice> slices;
    bool verify = false;
  };
  absl::Status UploadBatch(const ForwardPass& pass);
  absl::Status EmbedTokens(const ForwardPass& pass);
  absl::Status PrepareSlidingWindow(const ForwardPass& pass);
  absl::Status AttentionBlock(int32_t layer, const ForwardPass& pass);
  absl::Status StoreKvAndAttend(int32_t layer, const ForwardPass& pass);
  absl::Status FeedForwardBlock(int32_t layer, const ForwardPass& pass);
  // A mixture-of-experts layer: the rows of `input` routed by the router on `router_input`, each
  // row's experts' weighted sum to `out` ([rows, d_model]).
  absl::Status ExpertsBlock(int32_t layer, const float* input, const float* router_input,
                            float* out, const ForwardPass& pass);
  // x += projected, RMS-normalized first with `post_norm` where the config has post-norms.
  absl::Status AddToHiddenState(const float* post_norm, const ForwardPass& pass);
  absl::Status OutputHead(const ForwardPass& pass);
  // Sequence s's prefix length and first cache slot, as the forward's kernels read them.
  const int64_t* PrefixLengthOnDevice(size_t s) const { return d_.step + 2 * s; }
  const int64_t* FirstSlotOnDevice(size_t s) const { return d_.step + 2 * s + 1; }
  // EnqueueForward of a one-sequence draft forward through the captured graph of its shape
  // (captured first).
  absl::Status LaunchDraftGraph(const ForwardShape& shape, const SequenceSlice& slice);
  // The pinned batch staging: tokens, positions, logit rows (i32 [T] each, at 0, 4T, 8T), the
  // masks (u8, up to 2T x T, at 12T), then each sequence's prefix length and first slot (i64
  // 2 x [T]).
  int64_t StepStagingOffset() const {
    return 12 * options_.max_batch_rows + 2 * options_.max_batch_rows * options_.max_batch_rows;
  }
  uint64_t BatchStagingBytes() const {
    return static_cast<uint64_t>(StepStagingOffset()) +
           2 * static_cast<uint64_t>(options_.max_batch_rows) * sizeof(int64_t);
  }
  // outputs[i] = x · W_iᵀ (+ the residual in verify mode) for group `id`; x is [rows, cols].
  absl::Status Linear(model::LinearGroupId id, const float* x, int64_t rows,
                      std::span<float* const> outputs, bool verify);
  const Group& GroupOf(model::LinearGroupId id) const;
  // Expert `expert`'s slice of every tall matrix of expert group `group` (outputs unset).
  kernels::GroupMatMul ExpertSlices(const Group& group, int64_t expert) const;
  // Linear for an expert group of `layer`: x is [rows, expert input] grouped by expert as
  // `segments` say; outputs[i] rows get x · W_iᵀ of their segment's expert's slice of matrix i
  // (+ its residual in verify mode).
  absl::Status ExpertsLinear(int32_t layer, model::LinearGroup group, const float* x, int64_t rows,
                             std::span<const model::ExpertRows> segments,
                             std::span<float* const> outputs, bool verify);
  // x [rows, cols] rotated (when the model is) and quantized into d_.codes / act_scales /
  // act_sums; in verify mode also copied to the host staging (straight into the residual
  // source's when `staging` and it holds `rows`), then event `copied` recorded. Returns whether
  // the copy went to the source's staging.
  // In verify mode, after a group's base matmuls were queued: waits for the activations' copy,
  // runs `compute` (which leaves x · R_iᵀ of every matrix i, [rows][widths[i]] back to back, at
  // the address it returns), copies that to the device and adds matrix i's part to outputs[i].
  absl::Status AddResidual(size_t event_base, int64_t rows, std::span<const int64_t> widths,
                           std::span<float* const> outputs,
                           absl::FunctionRef<absl::StatusOr<const float*>()> compute);
  // For a residual source without staging: host_activations_ filled from the pinned copies of
  // [rows, cols], host_outputs[i] pointed at host_residual_ in AddResidual's layout and zeroed.
  const quant::QuantizedActivations& HostResidualCall(int64_t rows, int64_t cols,
                                                      std::span<const int64_t> widths,
                                                      float** host_outputs);
  absl::StatusOr<bool> QuantizeForGroup(const float* x, int64_t rows, int64_t cols, bool verify,
                                        bool staging, cudaEvent_t copied);

  model::ModelConfig config_;
  model::SplitQuantization quantization_;
  CudaModelOptions options_;
  model::VramPlan plan_;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  model::ResidualSource* residual_ = nullptr;
  bool staging_resolved_ = false;                    // for residual_
  const model::ResidualStaging* staging_ = nullptr;  // residual_'s, or none
  void* registered_ = nullptr;                       // the region this model registered
  bool staging_registered_ = false;
  std::unique_ptr<ThreadPool> pool_;      // handed to the residual source (in process: its threads)
  std::atomic<int64_t> live_caches_ = 0;  // a cache's destructor decrements it on any thread

  // Slabs (cudaMalloc) and what is carved from them.
  void* weights_slab_ = nullptr;
  void* constants_slab_ = nullptr;
  void* scratch_slab_ = nullptr;
  std::vector<Group> groups_;  // LinearGroupIndex order
  const uint8_t* embedding_ = nullptr;
  bool embedding_on_device_ = false;
  model::EmbeddingAndNorms host_embedding_;  // for the host gather of other types
  int32_t embedding_type_ = 0;
  int64_t embedding_row_bytes_ = 0;
  // The per-layer vectors (LayerVectorSpecs, one after another per layer) and the output norm.
  float* norms_ = nullptr;
  std::vector<model::LayerNorms> layer_vectors_;  // device addresses inside norms_
  // [layer]: layer_output_scale's value (a kernel argument; 1 where the model has none).
  std::vector<float> layer_output_scales_;
  const float* output_norm_ = nullptr;
  std::vector<const float*> routers_;  // [layer]: f32 [num_experts, d_model] (mixture of experts)
  float* rope_cos_ = nullptr;          // the global layers' table
  float* rope_sin_ = nullptr;
  float* rope_local_cos_ = nullptr;  // the local layers' (sliding-window models only)
  float* rope_local_sin_ = nullptr;
  uint32_t* hadamard_masks_ = nullptr;

  struct Scratch {
    int32_t* tokens;
    int32_t* positions;
    int32_t* logit_rows;
    uint8_t* mask;
    float* x;
    float* normed;
    float* q;
    float* k_new;
    float* v_new;
    float* attention;
    float* gate;
    float* up;
    float* projected;
    float* rotated;
    int8_t* codes;
    float* act_scales;
    float* act_sums;
    float* residual_output;
    float* logits;
    float* scores;
    int32_t* visible_slots;   // sliding-window models only
    int32_t* visible_counts;  // sliding-window models only
    // Mixture-of-experts models only (ForwardScratchLayout::expert_bytes).
    float* router_logits;
    float* experts_normed;
    float* router_input;
    int32_t* expert_of;
    float* expert_weights;
    int32_t* slot_of;
    int32_t* source_row;
    float* expert_input;
    float* expert_gate_up;
    float* expert_activation;
    float* expert_output;
    float* experts_sum;
    double* sampling;
    int32_t* top_ids;
    float* top_logits;
    double* log_normalizers;
    int32_t* choices;
    int64_t* choice_positions;
    // [prefix length, first slot] of each sequence of the running forward (i64 2 x [T]).
    int64_t* step = nullptr;
  } d_{};

  // Pinned host staging (one cudaHostAlloc, so copies are DMA): the batch, the quantized
  // activations of a group, the residual's output and host-gathered embedding rows. A source
  // with staging memory (ResidualSource::Staging: the shared-memory channel, registered for DMA)
  // receives the activations straight from the device; for any other source they are copied
  // into host_activations_, the QuantizedActivations that Accumulate takes.
  void* pinned_ = nullptr;
  uint8_t* host_batch_ = nullptr;
  int8_t* host_codes_ = nullptr;
  float* host_scales_ = nullptr;
  float* host_sums_ = nullptr;
  float* host_residual_ = nullptr;
  float* host_embedding_rows_ = nullptr;
  // Mixture of experts: a layer's router logits [T, E] and its routing [T x k] each.
  float* host_router_logits_ = nullptr;
  int32_t* host_expert_of_ = nullptr;
  float* host_expert_weights_ = nullptr;
  int32_t* host_slot_of_ = nullptr;
  int32_t* host_source_row_ = nullptr;
  quant::QuantizedActivations host_activations_;
  bool cuda_graphs_ = true;
  std::vector<CapturedForward> graphs_;
  int64_t graphs_captured_ = 0;
  int64_t graph_launches_ = 0;
  std::vector<cudaEvent_t> events_;  // per group: copy done, base done, residual arrives
  int64_t block_stride_max_ = 0;
  int64_t last_logit_rows_ = 0;
  ForwardTimings timings_;
};

}  // namespace bitsplit::cuda
