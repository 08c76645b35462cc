// The cpu-residual service as a process (services/cpu-residual): started and stopped by the
// tests, driven through common/rpc/residual_client.h (gRPC control + shared-memory channel) and
// compared bit for bit with the in-process residual (InProcessResidual).
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bitsplit/internal/v1/residual.grpc.pb.h"
#include "common/io/shm_channel.h"
#include "common/io/split_file.h"
#include "common/model/llama_model.h"
#include "common/model/remote_residual.h"
#include "common/model/split_backend.h"
#include "common/model/split_model.h"
#include "common/offline/split_quantizer.h"
#include "common/quant/split_format.h"
#include "common/quant/split_matmul.h"
#include "common/rpc/residual_client.h"
#include "common/util/thread_pool.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/service_process.h"
#include "tests/testing/split_fixture.h"
#include "tests/testing/synthetic_weights.h"

extern char** environ;

namespace bitsplit {
namespace {

namespace v1 = bitsplit::internal::v1;
using model::LinearGroup;
using model::LinearGroupId;
using Clock = std::chrono::steady_clock;
using testing::HealthStatus;
using testing::ServiceProcess;

const char kServiceBinary[] = BITSPLIT_BINARY_DIR "/services/cpu-residual/bitsplit-residual";
constexpr char kChildSocketEnv[] = "BITSPLIT_RESIDUAL_CHILD_SOCKET";
constexpr char kChildFingerprintEnv[] = "BITSPLIT_RESIDUAL_CHILD_FINGERPRINT";
constexpr char kChildMarkerEnv[] = "BITSPLIT_RESIDUAL_CHILD_MARKER";

// ---- A small synthetic residual ----------------------------------------------------------------

model::ModelConfig TinyConfig() {
  model::ModelConfig config;
  config.architecture = "llama";
  config.num_layers = 2;
  config.d_model = 128;
  config.d_ff = 256;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 32;
  config.rope_dims = 32;
  config.context_length = 256;
  config.vocab_size = 160;
  return config;
}

SplitFingerprint MakeFingerprint(uint8_t seed) {
  SplitFingerprint f;
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<uint8_t>(seed * 31 + i);
  return f;
}

// Writes a residual file of TinyConfig() with random r6/g32 matrices.
void WriteTinyResidual(const std::string& path, const SplitFingerprint& fingerprint) {
  const model::ModelConfig config = TinyConfig();
  model::SplitQuantization q;
  q.residual_format = quant::SplitFormat::kR6;
  q.residual_group = 32;
  const nlohmann::json metadata = {
      {model::kSplitMetadataKey, {{"version", 1}, {"quantization", SplitQuantizationToJson(q)}}}};
  auto writer = SplitFileWriter::Create(path, SplitFileKind::kResidual, fingerprint, metadata,
                                        model::SplitFormatRowSizeOracle());
  ASSERT_TRUE(writer.ok()) << writer.status();
  struct Matrix {
    std::string name;
    int64_t rows, cols;
  };
  std::vector<Matrix> matrices;
  for (const LinearGroupId id : model::AllLinearGroups(config)) {
    const auto names = model::LinearGroupTensorNames(config, id);
    const auto rows = model::LinearGroupOutputDims(config, id);
    for (size_t i = 0; i < names.size(); ++i) {
      matrices.push_back({names[i], rows[i], model::LinearGroupInputDim(config, id)});
    }
  }
  for (const Matrix& m : matrices) {
    ASSERT_TRUE((*writer)
                    ->DeclareTensor(m.name,
                                    SplitTensorFormat(static_cast<uint32_t>(*q.residual_format)),
                                    32, {m.cols, m.rows})
                    .ok());
  }
  std::mt19937 rng(fingerprint[0]);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  for (const Matrix& m : matrices) {
    const size_t row_bytes = quant::SplitRowBytes(*q.residual_format, 32, m.cols);
    std::vector<uint8_t> bytes(row_bytes * m.rows);
    std::vector<float> row(m.cols);
    for (int64_t r = 0; r < m.rows; ++r) {
      for (float& v : row) v = normal(rng);
      ASSERT_TRUE(quant::QuantizeResidualRow(*q.residual_format, 32, row.data(), m.cols,
                                             bytes.data() + r * row_bytes)
                      .ok());
    }
    ASSERT_TRUE((*writer)->WriteTensorData(m.name, bytes.data(), bytes.size()).ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
}

// ---- The service process -----------------------------------------------------------------------

bool WaitServing(const std::string& target, ServiceProcess& process) {
  return process.WaitServing(target, std::chrono::seconds(20));
}

// ---- Activations and the in-process reference --------------------------------------------------

quant::QuantizedActivations RandomActivations(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = normal(rng);
  quant::QuantizedActivations q;
  quant::QuantizeActivations(x.data(), rows, cols, &q);
  return q;
}

// The residual file mapped in the test process, as LlamaModel's verify mode holds it.
struct LocalResidual {
  std::unique_ptr<SplitFile> file;
  model::SplitLinearWeights weights;
  std::unique_ptr<model::InProcessResidual> source;

  static LocalResidual Open(const std::string& path, const model::ModelConfig& config) {
    LocalResidual local;
    auto file = SplitFile::Open(path, SplitFileKind::kResidual, model::SplitFormatRowSizeOracle());
    EXPECT_TRUE(file.ok()) << file.status();
    local.file = *std::move(file);
    local.weights = model::SplitLinearWeights(config);
    for (const LinearGroupId id : model::AllLinearGroups(config)) {
      for (const std::string& name : model::LinearGroupTensorNames(config, id)) {
        const SplitTensor* t = local.file->FindTensor(name);
        EXPECT_NE(t, nullptr) << name;
        const auto format = static_cast<quant::SplitFormat>(SplitFormatIdOf(t->format));
        local.weights.mutable_group(id).push_back(*quant::MakeMatrixView(
            format, static_cast<int>(t->group_size), t->rows(), t->cols(), t->data, t->num_bytes));
      }
    }
    local.source = std::make_unique<model::InProcessResidual>(local.weights);
    return local;
  }
};

// Outputs of a group pre-filled with a "base" result, so that accumulation is exercised.
struct GroupOutputs {
  std::vector<std::vector<float>> buffers;
  std::vector<float*> pointers;

  GroupOutputs(const model::ResidualGroupShape& shape, int64_t rows, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int64_t r : shape.rows) {
      buffers.emplace_back(static_cast<size_t>(rows * r));
      for (float& v : buffers.back()) v = uniform(rng);
    }
    for (auto& b : buffers) pointers.push_back(b.data());
  }
  bool operator==(const GroupOutputs& other) const {
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (buffers[i].size() != other.buffers[i].size() ||
          std::memcmp(buffers[i].data(), other.buffers[i].data(),
                      buffers[i].size() * sizeof(float)) != 0) {
        return false;
      }
    }
    return true;
  }
};

// A memfd named like the client library's attach proof (shm::kAttachProofPrefix + 32 hex
// digits), open while this object lives: what a raw Attach request must present.
class HeldProof {
 public:
  explicit HeldProof(uint32_t seed) {
    std::mt19937 rng(seed);
    name_ = shm::kAttachProofPrefix;
    for (int i = 0; i < 32; ++i) name_ += "0123456789abcdef"[rng() % 16];
    fd_ = memfd_create(name_.c_str(), MFD_CLOEXEC);
    EXPECT_GE(fd_, 0) << std::strerror(errno);
  }
  ~HeldProof() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  int fd_ = -1;
};

// ---- Fixture -----------------------------------------------------------------------------------

class ResidualServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char pattern[] = "/tmp/bitsplit-residual-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = new std::string(pattern);
    residual_path_ = new std::string(*dir_ + "/tiny.residual.bsplit");
    WriteTinyResidual(*residual_path_, MakeFingerprint(7));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete residual_path_;
  }

  void SetUp() override {
    socket_ =
        *dir_ + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".sock";
    target_ = "unix:" + socket_;
  }

  std::vector<std::string> Args(std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {*residual_path_, "--socket", socket_,      "--threads", "2",
                                     "--spin-us",     "20",       "--max-rows", "32"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  void StartService(ServiceProcess& process, std::vector<std::string> extra = {}) {
    ASSERT_TRUE(process.Start(Args(std::move(extra))));
    ASSERT_TRUE(WaitServing(target_, process)) << process.Stderr();
  }

  std::unique_ptr<rpc::ResidualClient> Connect(rpc::ResidualClientOptions options = {}) {
    auto client = rpc::ResidualClient::Connect(target_, options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static std::string FingerprintHex() { return SplitFingerprintToHex(MakeFingerprint(7)); }

  // Starts a copy of this test binary that attaches a channel (ResidualServiceChild.AttachAndLoop)
  // and loops requests on it until killed. Returns its pid once attached (its segment's name in
  // `shm_name`), or -1 (a test failure) when it did not attach within 20 s.
  pid_t SpawnAttachedChild(std::string* shm_name) {
    const std::string marker = *dir_ + "/child.marker";
    std::filesystem::remove(marker);
    std::vector<std::string> env_strings = {
        std::string(kChildSocketEnv) + "=" + socket_,
        std::string(kChildFingerprintEnv) + "=" + FingerprintHex(),
        std::string(kChildMarkerEnv) + "=" + marker};
    std::vector<char*> env;
    for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
    for (std::string& e : env_strings) env.push_back(e.data());
    env.push_back(nullptr);
    std::string self = std::filesystem::read_symlink("/proc/self/exe");
    std::string filter = "--gtest_filter=ResidualServiceChild.AttachAndLoop";
    char* argv[] = {self.data(), filter.data(), nullptr};
    pid_t child = 0;
    EXPECT_EQ(posix_spawn(&child, self.c_str(), nullptr, nullptr, argv, env.data()), 0);
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!std::filesystem::exists(marker) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!std::filesystem::exists(marker)) {
      ADD_FAILURE() << "the child process did not attach";
      kill(child, SIGKILL);
      waitpid(child, nullptr, 0);
      return -1;
    }
    // The marker is written in one go after the attach; wait until it has its content.
    while (shm_name->empty() && Clock::now() < deadline) {
      std::ifstream(marker) >> *shm_name;
      if (shm_name->empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return child;
  }

  // Starts the service, connects and attaches one channel of the tiny model's shapes into
  // service_, client_ and session_ (failures are recorded; session_ stays null then).
  void StartAndAttach() {
    service_ = std::make_unique<ServiceProcess>(kServiceBinary);
    StartService(*service_);
    client_ = Connect();
    if (client_ == nullptr) return;
    auto session = client_->Attach(FingerprintHex(), 0, &tiny_shapes_);
    EXPECT_TRUE(session.ok()) << session.status();
    if (session.ok()) session_ = *std::move(session);
  }

  static inline std::string* dir_ = nullptr;
  static inline std::string* residual_path_ = nullptr;
  std::string socket_;
  std::string target_;
  const model::ModelConfig tiny_config_ = TinyConfig();
  const model::ResidualShapes tiny_shapes_ = model::ResidualShapes::FromConfig(tiny_config_);
  // Destroyed in reverse order: the session detaches before the client and the service go.
  std::unique_ptr<ServiceProcess> service_;
  std::unique_ptr<rpc::ResidualClient> client_;
  std::unique_ptr<rpc::ResidualChannel> session_;
};

TEST_F(ResidualServiceTest, InfoDescribesTheResidual) {
  ServiceProcess service(kServiceBinary);
  StartService(service);
  auto client = Connect();
  auto info = client->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->fingerprint(), FingerprintHex());
  EXPECT_EQ(info->num_layers(), 2);
  EXPECT_EQ(info->groups_size(), 9);
  EXPECT_EQ(info->threads(), 2);
  EXPECT_EQ(info->max_rows(), 32);
  EXPECT_EQ(info->pid(), service.pid());
  EXPECT_EQ(info->groups(0).matrices(0).format(), "r6");
  EXPECT_GT(info->weight_bytes(), 0u);
  auto shapes = rpc::ShapesFromInfo(*info);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ(*shapes, model::ResidualShapes::FromConfig(TinyConfig()));
  // The socket is owner/group only.
  struct stat st;
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

TEST_F(ResidualServiceTest, SharedMemoryAndGrpcMatchInProcessBitForBit) {
  StartAndAttach();
  ASSERT_NE(session_, nullptr);
  // The segment is owner/group only.
  struct stat st;
  const std::string shm_path = "/dev/shm" + session_->attach_response().shm_name();
  ASSERT_EQ(stat(shm_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  LocalResidual local = LocalResidual::Open(*residual_path_, tiny_config_);
  rpc::GrpcResidual grpc_residual(*client_, tiny_shapes_);
  ThreadPool pool(3);
  uint32_t seed = 1;
  for (const LinearGroupId id : model::AllLinearGroups(tiny_config_)) {
    const model::ResidualGroupShape& shape = *tiny_shapes_.Find(id);
    for (int64_t rows : {1, 3, 16, 32}) {
      const quant::QuantizedActivations x = RandomActivations(rows, shape.cols, ++seed);
      GroupOutputs expected(shape, rows, seed), via_shm(shape, rows, seed),
          via_grpc(shape, rows, seed);
      ASSERT_TRUE(local.source->Accumulate(id, x, expected.pointers, pool).ok());
      absl::Status status = session_->residual().Accumulate(id, x, via_shm.pointers, pool);
      ASSERT_TRUE(status.ok()) << status;
      status = grpc_residual.Accumulate(id, x, via_grpc.pointers, pool);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_TRUE(via_shm == expected) << model::LinearGroupIdString(id) << " T=" << rows;
      EXPECT_TRUE(via_grpc == expected) << model::LinearGroupIdString(id) << " T=" << rows;
    }
  }
  EXPECT_GT(session_->residual().stats().calls, 0);
  ASSERT_TRUE(session_->Detach().ok());
  EXPECT_NE(stat(shm_path.c_str(), &st), 0) << "segment not removed on detach";
  EXPECT_EQ(client_->Info()->attached_clients(), 0u);
}

// The staging path (what the CUDA backend uses): activations written straight into the source's
// memory, y read straight out of it. base + y equals Accumulate's result bit for bit, through the
// service's shared segment and through the in-process source's own buffers; bad calls are refused.
TEST_F(ResidualServiceTest, StagedActivationsGiveAccumulatesBitsInSharedMemoryAndInProcess) {
  StartAndAttach();
  ASSERT_NE(session_, nullptr);
  LocalResidual local = LocalResidual::Open(*residual_path_, tiny_config_);
  model::InProcessResidual staged_local(local.weights);
  EXPECT_EQ(staged_local.SubmitStaged(LinearGroupId{0, model::LinearGroup::kQkv}, 1, 64).code(),
            absl::StatusCode::kInvalidArgument);  // no staging memory yet
  model::ResidualSource* sources[] = {&session_->residual(), &staged_local};
  auto beyond = sources[0]->Staging(33);  // the channel holds 32: it says so, and refuses 33
  ASSERT_TRUE(beyond.ok()) << beyond.status();
  EXPECT_EQ((*beyond)->max_rows, 32);
  EXPECT_EQ(sources[0]->Staging(0).status().code(), absl::StatusCode::kInvalidArgument);
  ThreadPool pool(3);
  uint32_t seed = 100;
  for (model::ResidualSource* source : sources) {
    auto staging = source->Staging(32);
    ASSERT_TRUE(staging.ok()) << staging.status();
    const model::ResidualStaging& st = **staging;
    ASSERT_NE(&st, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(st.region.data()) % 4096, 0u);
    for (const void* area :
         {static_cast<const void*>(st.codes), static_cast<const void*>(st.scales),
          static_cast<const void*>(st.sums), static_cast<const void*>(st.outputs)}) {
      EXPECT_GE(static_cast<const std::byte*>(area), st.region.data());
      EXPECT_LT(static_cast<const std::byte*>(area), st.region.data() + st.region.size());
    }
    for (const LinearGroupId id : model::AllLinearGroups(tiny_config_)) {
      const model::ResidualGroupShape& shape = *tiny_shapes_.Find(id);
      for (int64_t rows : {1, 3, 32}) {
        const quant::QuantizedActivations x = RandomActivations(rows, shape.cols, ++seed);
        GroupOutputs expected(shape, rows, seed), staged(shape, rows, seed);
        ASSERT_TRUE(local.source->Accumulate(id, x, expected.pointers, pool).ok());
        std::memcpy(st.codes, x.codes.data(), x.codes.size());
        std::memcpy(st.scales, x.scales.data(), x.scales.size() * sizeof(float));
        std::memcpy(st.sums, x.sums.data(), x.sums.size() * sizeof(float));
        ASSERT_TRUE(source->SubmitStaged(id, rows, shape.cols).ok());
        ASSERT_TRUE(source->WaitStaged(id, pool).ok());
        const float* y = st.outputs;
        for (std::vector<float>& out : staged.buffers) {
          for (float& v : out) v += *y++;
        }
        EXPECT_TRUE(staged == expected) << model::LinearGroupIdString(id) << " T=" << rows;
      }
    }
    const LinearGroupId qkv{0, model::LinearGroup::kQkv};
    EXPECT_EQ(source->SubmitStaged(qkv, 1, tiny_shapes_.Find(qkv)->cols + 32).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(source->SubmitStaged(qkv, 0, tiny_shapes_.Find(qkv)->cols).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(source->SubmitStaged(qkv, 33, tiny_shapes_.Find(qkv)->cols).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(source->WaitStaged(qkv, pool).code(), absl::StatusCode::kFailedPrecondition);
  }
  ASSERT_TRUE(session_->Detach().ok());
}

TEST_F(ResidualServiceTest, BadRequestsAreRejectedAndTheServiceKeepsServing) {
  ServiceProcess service(kServiceBinary);
  StartService(service);
  auto client = Connect();
  // A raw channel, so that requests bypass the client library's own checks.
  auto channel = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
  auto stub = v1::Residual::NewStub(channel);
  const HeldProof proof(1);
  v1::AttachRequest attach;
  attach.set_fingerprint(FingerprintHex());
  attach.set_client_pid(getpid());
  attach.set_pid_proof(proof.name());
  v1::AttachResponse attached;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Attach(&context, attach, &attached).ok());
  }
  shm::ShmClientOptions options;
  options.timeout = std::chrono::seconds(5);
  auto raw = shm::ShmChannelClient::Open(attached.shm_name(), attached.shm_bytes(),
                                         attached.server_pid(), options);
  ASSERT_TRUE(raw.ok()) << raw.status();
  const model::ModelConfig config = TinyConfig();
  const quant::QuantizedActivations x = RandomActivations(2, 128, 5);
  std::memcpy((*raw)->codes(), x.codes.data(), x.codes.size());
  std::memcpy((*raw)->scales(), x.scales.data(), x.scales.size() * sizeof(float));
  std::memcpy((*raw)->sums(), x.sums.data(), x.sums.size() * sizeof(float));
  struct Bad {
    int32_t layer;
    uint32_t group, rows, cols;
  };
  const Bad cases[] = {
      {2, 0, 2, 128},
      {-2, 0, 2, 128},
      {INT32_MAX, 0, 2, 128},
      {INT32_MIN, 1, 2, 128},
      {-1, 0, 2, 128},
      {0, 4, 2, 128},
      {0, 5, 2, 128},
      {0, UINT32_MAX, 2, 128},
      {0, 0, 0, 128},
      {0, 0, 33, 128},
      {0, 0, UINT32_MAX, 128},
      {0, 0, 2, 0},
      {0, 0, 2, 96},
      {0, 0, 2, 256},
      {0, 3, 2, 128},
      {0, 0, 2, UINT32_MAX},
      // The expert groups (5, 6) are not groups of this dense residual; 7 is none at all.
      {0, 6, 2, 128},
      {0, 7, 2, 128},
  };
  for (const Bad& bad : cases) {
    shm::ShmCallInfo info;
    const absl::Status status = (*raw)->Call(bad.layer, bad.group, bad.rows, bad.cols, &info);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << bad.layer << " " << bad.group << " " << bad.rows << " " << bad.cols << ": " << status;
    // A valid request right after still works.
    ASSERT_TRUE((*raw)->Call(0, 0, 2, 128, &info).ok());
    EXPECT_EQ(info.num_outputs, 3u);
    EXPECT_EQ(info.output_rows[0], 128u);
    EXPECT_EQ(info.output_rows[1], 64u);
  }
  // Garbage activations (e.g. -128 codes, NaN scales) cannot break the service either.
  std::memset((*raw)->codes(), 0x80, 2 * 128);
  for (int i = 0; i < 16; ++i) (*raw)->scales()[i] = std::nanf("");
  shm::ShmCallInfo info;
  EXPECT_TRUE((*raw)->Call(0, 0, 2, 128, &info).ok());

  // The same over gRPC, plus sizes that do not match.
  auto matmul = [&](int32_t layer, v1::MatrixGroup group, int32_t rows, int32_t cols, size_t codes,
                    size_t scales, size_t sums) {
    v1::MatMulRequest request;
    request.set_layer(layer);
    request.set_group(group);
    request.set_rows(rows);
    request.set_cols(cols);
    request.set_codes(std::string(codes, '\1'));
    request.set_scales(std::string(scales, '\0'));
    request.set_sums(std::string(sums, '\0'));
    v1::MatMulResponse response;
    grpc::ClientContext context;
    return stub->MatMul(&context, request, &response).error_code();
  };
  const size_t good_scales = 2 * 8 * sizeof(float);
  EXPECT_EQ(matmul(0, v1::MATRIX_GROUP_QKV, 2, 128, 256, good_scales, good_scales), grpc::OK);
  EXPECT_EQ(matmul(0, v1::MATRIX_GROUP_UNSPECIFIED, 2, 128, 256, good_scales, good_scales),
            grpc::INVALID_ARGUMENT);
  EXPECT_EQ(matmul(0, static_cast<v1::MatrixGroup>(77), 2, 128, 256, good_scales, good_scales),
            grpc::INVALID_ARGUMENT);
  EXPECT_EQ(matmul(5, v1::MATRIX_GROUP_QKV, 2, 128, 256, good_scales, good_scales),
            grpc::INVALID_ARGUMENT);
  EXPECT_EQ(matmul(0, v1::MATRIX_GROUP_OUTPUT_HEAD, 2, 128, 256, good_scales, good_scales),
            grpc::INVALID_ARGUMENT);
  EXPECT_EQ(matmul(0, v1::MATRIX_GROUP_QKV, 0, 128, 0, 0, 0), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(matmul(0, v1::MATRIX_GROUP_QKV, 33, 128, 33 * 128, 33 * 32, 33 * 32),
            grpc::INVALID_ARGUMENT);
  EXPECT_EQ(matmul(0, v1::MATRIX_GROUP_QKV, 2, 64, 128, good_scales, good_scales),
            grpc::INVALID_ARGUMENT);
  EXPECT_EQ(matmul(0, v1::MATRIX_GROUP_QKV, 2, 128, 255, good_scales, good_scales),
            grpc::INVALID_ARGUMENT);
  EXPECT_EQ(matmul(0, v1::MATRIX_GROUP_QKV, 2, 128, 256, good_scales - 4, good_scales),
            grpc::INVALID_ARGUMENT);
  EXPECT_EQ(matmul(0, v1::MATRIX_GROUP_QKV, 2, 128, 256, good_scales, 0), grpc::INVALID_ARGUMENT);
  // Bad attach requests.
  auto attach_code = [&](const std::string& fingerprint, int32_t pid, int32_t max_rows) {
    v1::AttachRequest request;
    request.set_fingerprint(fingerprint);
    request.set_client_pid(pid);
    request.set_max_rows(max_rows);
    request.set_pid_proof(proof.name());
    v1::AttachResponse response;
    grpc::ClientContext context;
    return stub->Attach(&context, request, &response).error_code();
  };
  EXPECT_EQ(attach_code(FingerprintHex(), 0, 0), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(attach_code(FingerprintHex(), -5, 0), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(attach_code(FingerprintHex(), 0x3fffffff, 0), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(attach_code(FingerprintHex(), getpid(), 33), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(attach_code(FingerprintHex(), getpid(), -1), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(attach_code("", getpid(), 0), grpc::INVALID_ARGUMENT);
  {
    v1::DetachRequest request;
    request.set_channel_id(12345);
    v1::DetachResponse response;
    grpc::ClientContext context;
    EXPECT_EQ(stub->Detach(&context, request, &response).error_code(), grpc::NOT_FOUND);
  }
  // Still serving, and computing.
  EXPECT_EQ(HealthStatus(target_), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_TRUE((*raw)->Call(-1, 4, 1, 128, &info).ok());
  EXPECT_EQ(info.output_rows[0], 160u);
  EXPECT_EQ(client->Info()->attached_clients(), 1u);
}

TEST_F(ResidualServiceTest, WrongFingerprintIsRefused) {
  ServiceProcess service(kServiceBinary);
  StartService(service);
  auto client = Connect();
  auto session = client->Attach(SplitFingerprintToHex(MakeFingerprint(8)), 0, nullptr);
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), absl::StatusCode::kFailedPrecondition) << session.status();
  EXPECT_NE(session.status().message().find(FingerprintHex()), std::string::npos);
  // Shapes of another model are refused by the client library.
  model::ModelConfig other = TinyConfig();
  other.d_ff = 512;
  const model::ResidualShapes other_shapes = model::ResidualShapes::FromConfig(other);
  session = client->Attach(FingerprintHex(), 0, &other_shapes);
  EXPECT_EQ(session.status().code(), absl::StatusCode::kFailedPrecondition) << session.status();
  EXPECT_EQ(client->Info()->attached_clients(), 0u);
}

// A raw Attach for `pid` presenting `proof` (the client library always sends its own pid and a
// proof it holds).
grpc::Status RawAttach(const std::string& target, const std::string& fingerprint, int32_t pid,
                       const std::string& proof, v1::AttachResponse* response) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = v1::Residual::NewStub(channel);
  v1::AttachRequest request;
  request.set_fingerprint(fingerprint);
  request.set_client_pid(pid);
  request.set_pid_proof(proof);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return stub->Attach(&context, request, response);
}

TEST_F(ResidualServiceTest, AttachIsOnlyForTheCallersOwnProcess) {
  ServiceProcess service(kServiceBinary);
  StartService(service);
  auto client = Connect();
  const HeldProof proof(2);
  v1::AttachResponse response;
  // Process 1 and another live process of this user (a child) do not hold this process's proof.
  grpc::Status status = RawAttach(target_, FingerprintHex(), 1, proof.name(), &response);
  EXPECT_EQ(status.error_code(), grpc::PERMISSION_DENIED) << status.error_message();
  EXPECT_NE(status.error_message().find("own process"), std::string::npos)
      << status.error_message();
  pid_t sleeper = 0;
  std::string sleep_path = "/bin/sleep", seconds = "30";
  char* argv[] = {sleep_path.data(), seconds.data(), nullptr};
  ASSERT_EQ(posix_spawn(&sleeper, sleep_path.c_str(), nullptr, nullptr, argv, environ), 0);
  status = RawAttach(target_, FingerprintHex(), sleeper, proof.name(), &response);
  EXPECT_EQ(status.error_code(), grpc::PERMISSION_DENIED) << status.error_message();
  kill(sleeper, SIGKILL);
  waitpid(sleeper, nullptr, 0);
  // No proof, or not one of the expected form.
  const std::string prefix = shm::kAttachProofPrefix;
  for (const std::string& bad :
       {std::string(), prefix + "0123", prefix + std::string(32, 'g'),
        std::string("bitsplit-attachX") + std::string(32, '0'), prefix + std::string(33, '0')}) {
    EXPECT_EQ(RawAttach(target_, FingerprintHex(), getpid(), bad, &response).error_code(),
              grpc::INVALID_ARGUMENT)
        << bad;
  }
  // A well-formed proof this process no longer holds.
  HeldProof closed(3);
  closed.Close();
  status = RawAttach(target_, FingerprintHex(), getpid(), closed.name(), &response);
  EXPECT_EQ(status.error_code(), grpc::PERMISSION_DENIED) << status.error_message();
  EXPECT_EQ(client->Info()->attached_clients(), 0u);
  // Its own pid with the proof it holds: attached.
  status = RawAttach(target_, FingerprintHex(), getpid(), proof.name(), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(std::filesystem::exists("/dev/shm" + response.shm_name()));
  EXPECT_EQ(client->Info()->attached_clients(), 1u);
}

TEST_F(ResidualServiceTest, AttachOfAnotherUsersProcessCannotBeVerified) {
  // The service runs as nobody, so it may not read this (root) process's fd table.
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to run the service as another user";
  if (!std::filesystem::exists("/usr/bin/setpriv")) GTEST_SKIP() << "no setpriv";
  const std::string dir = *dir_ + "/nobody";
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(*dir_, std::filesystem::perms::others_exec,
                               std::filesystem::perm_options::add);
  std::filesystem::permissions(dir, std::filesystem::perms::all);
  const std::string residual = dir + "/tiny.residual.bsplit";
  std::filesystem::copy_file(*residual_path_, residual);
  std::filesystem::permissions(residual, std::filesystem::perms::others_read,
                               std::filesystem::perm_options::add);
  const std::string socket = dir + "/residual.sock";
  ServiceProcess service("/usr/bin/setpriv");
  ASSERT_TRUE(service.Start({"--reuid=65534", "--regid=65534", "--clear-groups", kServiceBinary,
                             residual, "--socket", socket, "--threads", "1"}));
  ASSERT_TRUE(WaitServing("unix:" + socket, service)) << service.Stderr();
  const HeldProof proof(4);
  v1::AttachResponse response;
  const grpc::Status status =
      RawAttach("unix:" + socket, FingerprintHex(), getpid(), proof.name(), &response);
  EXPECT_EQ(status.error_code(), grpc::PERMISSION_DENIED) << status.error_message();
  EXPECT_NE(status.error_message().find("cannot be verified"), std::string::npos)
      << status.error_message();
}

TEST_F(ResidualServiceTest, ChannelLimitsRefuseBeyondWithResourceExhausted) {
  {
    ServiceProcess service(kServiceBinary);
    StartService(service, {"--max-channels", "4", "--max-channels-per-client", "2"});
    auto client = Connect();
    auto first = client->Attach(FingerprintHex(), 0, &tiny_shapes_);
    auto second = client->Attach(FingerprintHex(), 0, &tiny_shapes_);
    ASSERT_TRUE(first.ok() && second.ok()) << first.status() << " " << second.status();
    auto third = client->Attach(FingerprintHex(), 0, &tiny_shapes_);
    EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
    EXPECT_NE(third.status().message().find("per-client limit"), std::string::npos)
        << third.status();
    // Another process still gets a channel: the limit is per client process.
    std::string shm_name;
    const pid_t child = SpawnAttachedChild(&shm_name);
    ASSERT_GT(child, 0);
    EXPECT_EQ(client->Info()->attached_clients(), 3u);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    // A detached channel frees its place.
    ASSERT_TRUE((*first)->Detach().ok());
    third = client->Attach(FingerprintHex(), 0, &tiny_shapes_);
    EXPECT_TRUE(third.ok()) << third.status();
  }
  {
    ServiceProcess service(kServiceBinary);
    StartService(service, {"--max-channels", "2", "--max-channels-per-client", "4"});
    auto client = Connect();
    auto first = client->Attach(FingerprintHex(), 0, &tiny_shapes_);
    auto second = client->Attach(FingerprintHex(), 0, &tiny_shapes_);
    ASSERT_TRUE(first.ok() && second.ok()) << first.status() << " " << second.status();
    auto third = client->Attach(FingerprintHex(), 0, &tiny_shapes_);
    EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
    EXPECT_NE(third.status().message().find("already has 2 attached channels, its limit"),
              std::string::npos)
        << third.status();
    EXPECT_EQ(client->Info()->attached_clients(), 2u);
  }
  for (const std::string flag : {"--max-channels", "--max-channels-per-client"}) {
    ServiceProcess bad(kServiceBinary);
    ASSERT_TRUE(bad.Start({*residual_path_, "--socket", socket_, flag, "0"}));
    EXPECT_NE(bad.Wait(std::chrono::seconds(10)), 0) << flag;
    EXPECT_NE(bad.Stderr().find(flag), std::string::npos) << bad.Stderr();
  }
}

TEST_F(ResidualServiceTest, KilledServiceSegmentIsRemovedByItsClientAndOnlyThen) {
  rpc::ResidualClientOptions options;
  options.rpc_timeout = std::chrono::milliseconds(1000);
  options.shm.liveness_timeout = std::chrono::milliseconds(500);
  {
    // A stopped service lives: its client gives up on it, but leaves the segment alone.
    ServiceProcess service(kServiceBinary);
    StartService(service);
    auto client = Connect(options);
    auto session = client->Attach(FingerprintHex(), 0, &tiny_shapes_);
    ASSERT_TRUE(session.ok()) << session.status();
    const std::string path = "/dev/shm" + (*session)->attach_response().shm_name();
    service.Stop();
    ThreadPool pool(1);
    const quant::QuantizedActivations x = RandomActivations(2, 128, 5);
    GroupOutputs out(*tiny_shapes_.Find({0, LinearGroup::kQkv}), 2, 5);
    EXPECT_EQ(
        (*session)->residual().Accumulate({0, LinearGroup::kQkv}, x, out.pointers, pool).code(),
        absl::StatusCode::kUnavailable);
    session->reset();  // the Detach call times out
    EXPECT_TRUE(std::filesystem::exists(path));
    service.Kill(SIGKILL);
    shm_unlink(path.substr(8).c_str());  // no client left to see the death
  }
  // Killed: the watcher of the idle session removes the segment at once.
  ServiceProcess service(kServiceBinary);
  StartService(service);
  auto client = Connect(options);
  auto session = client->Attach(FingerprintHex(), 0, &tiny_shapes_);
  ASSERT_TRUE(session.ok()) << session.status();
  const std::string path = "/dev/shm" + (*session)->attach_response().shm_name();
  ASSERT_TRUE(std::filesystem::exists(path));
  service.Kill(SIGKILL);
  const auto killed = Clock::now();
  while (std::filesystem::exists(path) && Clock::now() - killed < std::chrono::seconds(2)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_LT(Clock::now() - killed, std::chrono::milliseconds(500));
  EXPECT_TRUE((*session)->unlinked_dead_segment());
  EXPECT_FALSE((*session)->residual().healthy());
  // Nothing is left to detach from: OK at once.
  const auto start = Clock::now();
  EXPECT_TRUE((*session)->Detach().ok());
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(200));
}

TEST(ShmChannelClientTest, RemovesAnExitedServicesSegmentOnlyWhileTheNameIsThatSegment) {
  // The "service" is a child that only waits; the test creates its segments for it.
  const pid_t server = fork();
  ASSERT_GE(server, 0);
  if (server == 0) {
    pause();
    _exit(0);
  }
  auto layout = shm::ComputeShmLayout(4, 128, 384);
  ASSERT_TRUE(layout.ok());
  const SplitFingerprint fingerprint = MakeFingerprint(9);
  const std::string base = "/bitsplit-unlink-test-" + std::to_string(getpid());
  const std::string replaced = base + "-a", removed = base + "-b";
  auto segment_a =
      shm::ShmSegment::Create(replaced, *layout, 1, server, getpid(), fingerprint.data());
  auto segment_b =
      shm::ShmSegment::Create(removed, *layout, 2, server, getpid(), fingerprint.data());
  ASSERT_TRUE(segment_a.ok() && segment_b.ok());
  auto a = shm::ShmChannelClient::Open(replaced, layout->segment_bytes, server, {});
  auto b = shm::ShmChannelClient::Open(removed, layout->segment_bytes, server, {});
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
  // Alive, and alive but stopped: nothing is removed.
  EXPECT_FALSE((*a)->ServiceExited());
  EXPECT_FALSE((*a)->UnlinkIfServiceExited());
  kill(server, SIGSTOP);
  EXPECT_FALSE((*b)->UnlinkIfServiceExited());
  EXPECT_TRUE(std::filesystem::exists("/dev/shm" + removed));
  kill(server, SIGKILL);
  ASSERT_EQ(waitpid(server, nullptr, 0), server);
  EXPECT_TRUE((*a)->ServiceExited());
  EXPECT_FALSE((*a)->Healthy());
  // Another object took the first name since: it stays.
  (*segment_a)->Unlink();
  const int fd = shm_open(replaced.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  EXPECT_FALSE((*a)->UnlinkIfServiceExited());
  EXPECT_TRUE(std::filesystem::exists("/dev/shm" + replaced));
  shm_unlink(replaced.c_str());
  // The second name is still the segment: removed (once).
  EXPECT_TRUE((*b)->UnlinkIfServiceExited());
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + removed));
  EXPECT_FALSE((*b)->UnlinkIfServiceExited());
}

// The body of the child process of ClientKilledMidRequestIsReclaimed (skipped otherwise): attach,
// then issue requests until killed.
TEST(ResidualServiceChild, AttachAndLoop) {
  const char* socket = std::getenv(kChildSocketEnv);
  if (socket == nullptr) GTEST_SKIP() << "only run as a child process";
  auto client = rpc::ResidualClient::Connect(std::string("unix:") + socket, {});
  ASSERT_TRUE(client.ok());
  const model::ResidualShapes shapes = model::ResidualShapes::FromConfig(TinyConfig());
  auto session = (*client)->Attach(std::getenv(kChildFingerprintEnv), 0, &shapes);
  ASSERT_TRUE(session.ok()) << session.status();
  std::ofstream(std::getenv(kChildMarkerEnv)) << (*session)->attach_response().shm_name();
  ThreadPool pool(1);
  const quant::QuantizedActivations x = RandomActivations(32, 256, 3);
  GroupOutputs out(*shapes.Find({0, LinearGroup::kDown}), 32, 3);
  while (true) {
    if (!(*session)->residual().Accumulate({0, LinearGroup::kDown}, x, out.pointers, pool).ok()) {
      break;
    }
  }
}

TEST_F(ResidualServiceTest, ClientKilledMidRequestIsReclaimed) {
  ServiceProcess service(kServiceBinary);
  StartService(service);
  std::string shm_name;
  const pid_t child = SpawnAttachedChild(&shm_name);
  ASSERT_GT(child, 0);
  auto client = Connect();
  EXPECT_EQ(client->Info()->attached_clients(), 1u);
  // Freeze the service so that the child is certainly waiting on a request, kill the child,
  // then let the service go on: it answers into the dead client's segment and reclaims it.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  service.Stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  service.Signal(SIGCONT);
  const auto reclaim_deadline = Clock::now() + std::chrono::seconds(5);
  uint32_t attached = 1;
  while (Clock::now() < reclaim_deadline) {
    attached = client->Info()->attached_clients();
    if (attached == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(attached, 0u);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + shm_name));
  // And serves the next client.
  const model::ResidualShapes shapes = model::ResidualShapes::FromConfig(TinyConfig());
  auto session = client->Attach(FingerprintHex(), 0, &shapes);
  ASSERT_TRUE(session.ok()) << session.status();
  ThreadPool pool(1);
  const quant::QuantizedActivations x = RandomActivations(4, 128, 9);
  GroupOutputs out(*shapes.Find({1, LinearGroup::kQkv}), 4, 9);
  EXPECT_TRUE(
      (*session)->residual().Accumulate({1, LinearGroup::kQkv}, x, out.pointers, pool).ok());
}

TEST_F(ResidualServiceTest, ServiceKilledMidRequestGivesUnavailableThenRestartWorks) {
  const model::ModelConfig config = TinyConfig();
  const model::ResidualShapes shapes = model::ResidualShapes::FromConfig(config);
  LocalResidual local = LocalResidual::Open(*residual_path_, config);
  ThreadPool pool(1);
  const LinearGroupId id{1, LinearGroup::kGateUp};
  const quant::QuantizedActivations x = RandomActivations(8, 128, 11);
  rpc::ResidualClientOptions options;
  options.shm.timeout = std::chrono::seconds(5);
  options.shm.liveness_timeout = std::chrono::milliseconds(700);
  {
    ServiceProcess service(kServiceBinary);
    StartService(service);
    auto client = Connect(options);
    auto session = client->Attach(FingerprintHex(), 0, &shapes);
    ASSERT_TRUE(session.ok()) << session.status();
    GroupOutputs out(*shapes.Find(id), 8, 1);
    const absl::Status first = (*session)->residual().Accumulate(id, x, out.pointers, pool);
    ASSERT_TRUE(first.ok()) << first;

    // Killed while a request is pending: UNAVAILABLE quickly, not at the timeout.
    service.Stop();
    auto pending = std::async(std::launch::async, [&] {
      const auto start = Clock::now();
      const absl::Status status = (*session)->residual().Accumulate(id, x, out.pointers, pool);
      return std::make_pair(status, Clock::now() - start);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    service.Kill(SIGKILL);
    ASSERT_EQ(pending.wait_for(std::chrono::seconds(4)), std::future_status::ready);
    const auto [status, elapsed] = pending.get();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_LT(elapsed, std::chrono::seconds(1));
    // The channel stays broken (reattach needed).
    EXPECT_EQ((*session)->residual().Accumulate(id, x, out.pointers, pool).code(),
              absl::StatusCode::kUnavailable);
    EXPECT_FALSE((*session)->residual().healthy());
  }
  {
    // A hung (stopped) service: UNAVAILABLE after the liveness timeout, never a hang.
    ServiceProcess service(kServiceBinary);
    StartService(service);
    auto client = Connect(options);
    auto session = client->Attach(FingerprintHex(), 0, &shapes);
    ASSERT_TRUE(session.ok()) << session.status();
    GroupOutputs out(*shapes.Find(id), 8, 1);
    service.Stop();
    const auto start = Clock::now();
    const absl::Status status = (*session)->residual().Accumulate(id, x, out.pointers, pool);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
    service.Kill(SIGKILL);
  }
  // Restart on the same socket and reattach: results as before.
  ServiceProcess service(kServiceBinary);
  StartService(service);
  auto client = Connect(options);
  auto session = client->Attach(FingerprintHex(), 0, &shapes);
  ASSERT_TRUE(session.ok()) << session.status();
  GroupOutputs expected(*shapes.Find(id), 8, 2), got(*shapes.Find(id), 8, 2);
  ASSERT_TRUE(local.source->Accumulate(id, x, expected.pointers, pool).ok());
  ASSERT_TRUE((*session)->residual().Accumulate(id, x, got.pointers, pool).ok());
  EXPECT_TRUE(got == expected);
}

TEST_F(ResidualServiceTest, HealthFlipsToNotServingDuringGracefulShutdown) {
  ServiceProcess service(kServiceBinary);
  StartService(service, {"--shutdown-grace-ms", "1500"});
  auto client = Connect();
  const model::ResidualShapes shapes = model::ResidualShapes::FromConfig(TinyConfig());
  auto session = client->Attach(FingerprintHex(), 0, &shapes);
  ASSERT_TRUE(session.ok()) << session.status();
  service.Signal(SIGTERM);
  int health = -1;
  const auto deadline = Clock::now() + std::chrono::milliseconds(1200);
  while (Clock::now() < deadline) {
    health = HealthStatus(target_);
    if (health == grpc::health::v1::HealthCheckResponse::NOT_SERVING) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(health, grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(service.Wait(std::chrono::seconds(15)), 0) << service.Stderr();
  EXPECT_FALSE(std::filesystem::exists(socket_));
  // The attached client learns that the service is gone.
  ThreadPool pool(1);
  const quant::QuantizedActivations x = RandomActivations(1, 128, 1);
  GroupOutputs out(*shapes.Find({0, LinearGroup::kQkv}), 1, 1);
  EXPECT_EQ((*session)->residual().Accumulate({0, LinearGroup::kQkv}, x, out.pointers, pool).code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(ResidualServiceTest, RefusesCorruptFilesAndTooLittleRam) {
  // Truncated.
  const std::string truncated = *dir_ + "/truncated.residual.bsplit";
  std::filesystem::copy_file(*residual_path_, truncated,
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(truncated, std::filesystem::file_size(truncated) - 100);
  ServiceProcess bad(kServiceBinary);
  ASSERT_TRUE(bad.Start({truncated, "--socket", socket_}));
  EXPECT_EQ(bad.Wait(std::chrono::seconds(10)), 1);
  EXPECT_NE(bad.Stderr().find(truncated), std::string::npos) << bad.Stderr();
  // Not a split file at all.
  const std::string garbage = *dir_ + "/garbage.bsplit";
  std::ofstream(garbage) << std::string(4096, 'x');
  ServiceProcess bad2(kServiceBinary);
  ASSERT_TRUE(bad2.Start({garbage, "--socket", socket_}));
  EXPECT_EQ(bad2.Wait(std::chrono::seconds(10)), 1);
  // Too little RAM: refused with the numbers.
  ServiceProcess small(kServiceBinary);
  ASSERT_TRUE(small.Start({*residual_path_, "--socket", socket_, "--memory-limit-bytes", "4096"}));
  EXPECT_EQ(small.Wait(std::chrono::seconds(10)), 1);
  const std::string message = small.Stderr();
  EXPECT_NE(message.find("RAM"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(std::filesystem::file_size(*residual_path_))),
            std::string::npos)
      << message;
}

// Poll times outside [0, 1 s] are refused at start, naming the option.
TEST_F(ResidualServiceTest, RefusesPollTimesOutOfRange) {
  for (const std::string flag : {"--spin-us", "--yield-us"}) {
    for (const std::string value : {"-5", "1000001"}) {
      ServiceProcess bad(kServiceBinary);
      ASSERT_TRUE(bad.Start({*residual_path_, "--socket", socket_, flag, value}));
      EXPECT_NE(bad.Wait(std::chrono::seconds(10)), 0) << flag << " " << value;
      EXPECT_NE(bad.Stderr().find(flag + ": Value " + value), std::string::npos) << bad.Stderr();
    }
  }
}

TEST_F(ResidualServiceTest, MlockFailureNamesTheLimit) {
  // Run with RLIMIT_MEMLOCK of 64 KiB through prlimit(1) when available. Root's CAP_IPC_LOCK
  // ignores the limit, so as root the service runs under setpriv(1) with CAP_IPC_LOCK dropped
  // from the bounding set (the capability an exec by root would otherwise get back); only
  // without setpriv may root lock anyway, and then the service must report mlocked = true.
  if (std::system("command -v prlimit >/dev/null 2>&1") != 0) GTEST_SKIP() << "no prlimit";
  const bool drop_ipc_lock =
      geteuid() == 0 && std::system("command -v setpriv >/dev/null 2>&1") == 0;
  ServiceProcess service(kServiceBinary);
  std::vector<std::string> args = {"--memlock=65536"};
  if (drop_ipc_lock) args.insert(args.end(), {"setpriv", "--bounding-set=-ipc_lock", "--"});
  args.push_back(kServiceBinary);
  std::vector<std::string> rest = Args({"--mlock"});
  args.insert(args.end(), rest.begin(), rest.end());
  std::string command = "prlimit";
  for (const std::string& a : args) command += " '" + a + "'";
  command += " 2>" + *dir_ + "/mlock.log & echo $! > " + *dir_ + "/mlock.pid; wait";
  auto done = std::async(std::launch::async, [&] { return std::system(command.c_str()); });
  if (done.wait_for(std::chrono::seconds(3)) == std::future_status::ready) {
    std::ifstream in(*dir_ + "/mlock.log");
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_NE(text.str().find("RLIMIT_MEMLOCK"), std::string::npos) << text.str();
    EXPECT_NE(text.str().find(std::to_string(std::filesystem::file_size(*residual_path_))),
              std::string::npos)
        << text.str();
  } else {
    // It started: locking was allowed (CAP_IPC_LOCK), which must not happen without it.
    EXPECT_FALSE(drop_ipc_lock) << "--mlock succeeded beyond RLIMIT_MEMLOCK without CAP_IPC_LOCK";
    auto client = Connect();
    EXPECT_TRUE(client->Info()->mlocked());
    pid_t pid = 0;
    std::ifstream(*dir_ + "/mlock.pid") >> pid;
    if (pid > 0) kill(pid, SIGKILL);
    done.wait();
  }
}

// --pin gives every kernel thread (the pool's, and each channel's thread, which runs kernel
// thread 0) one CPU of the allowed set, distinct while CPUs last.
TEST_F(ResidualServiceTest, PinGivesEachKernelThreadItsOwnCpu) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  const int cpus = CPU_COUNT(&allowed);
  ServiceProcess service(kServiceBinary);
  StartService(service, {"--pin"});
  // Kernel thread 0 is the thread of a client's channel: attach one.
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const model::ResidualShapes shapes = model::ResidualShapes::FromConfig(TinyConfig());
  auto session = client->Attach(FingerprintHex(), 0, &shapes);
  ASSERT_TRUE(session.ok()) << session.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // Per thread of the service, its affinity list as /proc shows it ("3", "0-1", ...).
  std::map<std::string, int> threads_per_cpu_list;
  const std::string tasks = "/proc/" + std::to_string(service.pid()) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(tasks)) {
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("Cpus_allowed_list:", 0) == 0) {
        ++threads_per_cpu_list[line.substr(line.find_first_not_of(" \t", 18))];
      }
    }
  }
  // Args() asks for 2 kernel threads: as many distinct single-CPU lists as CPUs, up to 2.
  int single_cpu_lists = 0;
  for (const auto& [list, count] : threads_per_cpu_list) {
    if (list.find_first_of(",-") == std::string::npos) ++single_cpu_lists;
  }
  EXPECT_GE(single_cpu_lists, std::min(2, cpus));
  session->reset();  // detach first: a connected client makes the graceful shutdown slow
  client.reset();
  service.Stop();
}

// ---- The real model: LlamaModel's verify forward with the remote residual ----------------------

// A prefill of `prompt`, then a tree of `tree` / `parents` after it: the verify logits of the
// split model with its residual in process and of the same base with `remote_verify` (the
// residual in cpu-residual) are identical bit for bit.
void ExpectRemoteVerifyMatchesInProcess(model::LlamaModel& in_process,
                                        model::LlamaModel& draft_only,
                                        model::LinearBackend& remote_verify,
                                        const std::vector<int32_t>& prompt,
                                        const std::vector<int32_t>& tree,
                                        const std::vector<int32_t>& parents) {
  auto expected_cache = in_process.NewKvCache(64);
  auto remote_cache = draft_only.NewKvCache(64);
  ASSERT_TRUE(expected_cache.ok() && remote_cache.ok());
  const size_t vocab = static_cast<size_t>(in_process.config().vocab_size);
  const model::Batch prefill = model::Batch::Causal(prompt, 0);
  auto verify = model::Batch::Tree(tree, parents, static_cast<int32_t>(prompt.size()));
  ASSERT_TRUE(verify.ok()) << verify.status();
  for (const model::Batch* batch : {&prefill, static_cast<const model::Batch*>(&*verify)}) {
    std::vector<float> expected(batch->tokens.size() * vocab, 0.0f);
    std::vector<float> got(batch->tokens.size() * vocab, 1.0f);
    ASSERT_TRUE(in_process
                    .Forward(*batch, *expected_cache, std::span<float>(expected),
                             model::ForwardMode::kVerify)
                    .ok());
    const absl::Status status =
        draft_only.ForwardWith(remote_verify, *batch, *remote_cache, std::span<float>(got));
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(std::memcmp(expected.data(), got.data(), expected.size() * sizeof(float)), 0);
    ASSERT_TRUE(expected_cache->Commit(static_cast<int64_t>(batch->tokens.size())).ok());
    ASSERT_TRUE(remote_cache->Commit(static_cast<int64_t>(batch->tokens.size())).ok());
  }
}

TEST(ResidualServiceModelTest, VerifyForwardWithRemoteResidualMatchesInProcess) {
  const std::string gguf =
      std::string(BITSPLIT_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::filesystem::exists(gguf)) << gguf << " is missing (scripts/setup.sh)";
  char pattern[] = "/tmp/bitsplit-residual-model-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  const std::string prefix = dir + "/smol";
  offline::SplitQuantizeOptions options;
  options.quantization.residual_format = quant::SplitFormat::kR6;
  options.quantization.residual_group = 32;
  auto summary = offline::QuantizeSplitModel(gguf, prefix + ".base.bsplit",
                                             prefix + ".residual.bsplit", options);
  ASSERT_TRUE(summary.ok()) << summary.status();

  auto in_process = model::LlamaModel::LoadSplit(summary->base_path, summary->residual_path, 2);
  ASSERT_TRUE(in_process.ok()) << in_process.status();
  auto draft_only = model::LlamaModel::LoadSplit(summary->base_path, "", 2);
  ASSERT_TRUE(draft_only.ok()) << draft_only.status();

  ServiceProcess service(kServiceBinary);
  const std::string socket = dir + "/residual.sock";
  ASSERT_TRUE(service.Start(
      {summary->residual_path, "--socket", socket, "--threads", "2", "--max-rows", "16"}));
  ASSERT_TRUE(WaitServing("unix:" + socket, service)) << service.Stderr();
  auto client = rpc::ResidualClient::Connect("unix:" + socket, {});
  ASSERT_TRUE(client.ok()) << client.status();
  const model::ModelConfig& config = (*draft_only)->config();
  const model::ResidualShapes shapes = model::ResidualShapes::FromConfig(config);
  auto session = (*client)->Attach(SplitFingerprintToHex(summary->fingerprint), 16, &shapes);
  ASSERT_TRUE(session.ok()) << session.status();
  const model::SplitModelFiles& files = *(*draft_only)->split_files();
  model::SplitLinearBackend remote_verify(files.base_linear(), files.quantization().rotation,
                                          &(*session)->residual());

  ExpectRemoteVerifyMatchesInProcess(**in_process, **draft_only, remote_verify,
                                     {1, 504, 3458, 282, 253, 1345, 30}, {42, 43, 44, 45, 46},
                                     {-1, 0, 0, 1, 3});
  session->reset();
  service.Signal(SIGTERM);
  EXPECT_EQ(service.Wait(std::chrono::seconds(15)), 0) << service.Stderr();
  std::filesystem::remove_all(dir);
}

// A mixture-of-experts model (the random qwen3moe and gemma4 MoE of the oracle fixtures): each
// verify sends cpu-residual the routed rows of every expert group with their experts (the
// segment table), and the service computes each segment through its expert's residual slice.
// Logits equal the in-process verify bit for bit; the service's counters show each routed
// expert read once per request; requests with bad segments are refused and the service keeps
// serving.
class ResidualServiceMoeTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ResidualServiceMoeTest, VerifyForwardWithRemoteExpertsMatchesInProcess) {
  const testing::SyntheticModelFile source(GetParam());
  ASSERT_TRUE(source.ok());
  char pattern[] = "/tmp/bitsplit-residual-moe-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  auto summary = offline::QuantizeSplitModel(
      source.path(), dir + "/moe.base.bsplit", dir + "/moe.residual.bsplit",
      {.quantization = testing::SplitFixtureQuantization(), .num_threads = 2});
  ASSERT_TRUE(summary.ok()) << summary.status();
  auto in_process = model::LlamaModel::LoadSplit(summary->base_path, summary->residual_path, 2);
  auto draft_only = model::LlamaModel::LoadSplit(summary->base_path, "", 2);
  ASSERT_TRUE(in_process.ok() && draft_only.ok());
  const model::ModelConfig& config = (*draft_only)->config();
  ASSERT_TRUE(config.has_experts());

  ServiceProcess service(kServiceBinary);
  const std::string socket = dir + "/residual.sock";
  ASSERT_TRUE(service.Start(
      {summary->residual_path, "--socket", socket, "--threads", "2", "--max-rows", "64"}));
  ASSERT_TRUE(WaitServing("unix:" + socket, service)) << service.Stderr();
  auto client = rpc::ResidualClient::Connect("unix:" + socket, {});
  ASSERT_TRUE(client.ok()) << client.status();
  const model::ResidualShapes shapes = model::ResidualShapes::FromConfig(config);
  auto session = (*client)->Attach(SplitFingerprintToHex(summary->fingerprint), 64, &shapes);
  ASSERT_TRUE(session.ok()) << session.status();
  const model::SplitModelFiles& files = *(*draft_only)->split_files();
  model::SplitLinearBackend remote_verify(files.base_linear(), files.quantization().rotation,
                                          &(*session)->residual());

  // A prefill of 12 tokens, then a tree of 5 nodes, each one request per group of the forward
  // (the expert groups included: the layers' groups and the head).
  const std::vector<int32_t> all = source.fixture()["cases"][0]["tokens"];
  const auto info_before = (*client)->Info();
  ASSERT_TRUE(info_before.ok());
  ExpectRemoteVerifyMatchesInProcess(**in_process, **draft_only, remote_verify,
                                     std::vector<int32_t>(all.begin(), all.begin() + 12),
                                     std::vector<int32_t>(all.begin() + 12, all.begin() + 17),
                                     {-1, 0, 0, 1, 3});
  const auto info_after = (*client)->Info();
  ASSERT_TRUE(info_after.ok());
  EXPECT_EQ(info_after->requests_served() - info_before->requests_served(),
            2 * model::AllLinearGroups(config).size());

  // Bad segments, through the raw channel: each refused with INVALID_ARGUMENT, then a valid
  // request still works.
  shm::ShmChannelClient& raw = (*session)->residual().channel();
  const int64_t cols = config.d_model;
  const quant::QuantizedActivations x = RandomActivations(4, cols, 9);
  std::memcpy(raw.codes(), x.codes.data(), x.codes.size());
  std::memcpy(raw.scales(), x.scales.data(), x.scales.size() * sizeof(float));
  std::memcpy(raw.sums(), x.sums.data(), x.sums.size() * sizeof(float));
  const auto gate_up = static_cast<uint32_t>(LinearGroup::kExpertGateUp);
  const auto call = [&](uint32_t group, std::vector<shm::ShmExpertSegment> segments) {
    std::copy(segments.begin(), segments.end(), raw.segments());
    shm::ShmCallInfo info;
    return raw.Call(0, group, 4, static_cast<uint32_t>(cols), &info,
                    static_cast<uint32_t>(segments.size()));
  };
  const int32_t experts = static_cast<int32_t>(config.num_experts);
  const struct {
    uint32_t group;
    std::vector<shm::ShmExpertSegment> segments;
  } bad[] = {
      {gate_up, {}},                       // an expert group without segments
      {0, {{0, 0, 4, 0}}},                 // a dense group with segments
      {gate_up, {{experts, 0, 4, 0}}},     // no such expert
      {gate_up, {{-1, 0, 4, 0}}},          // no such expert
      {gate_up, {{1, 2, 3, 0}}},           // rows beyond the request's 4
      {gate_up, {{1, UINT32_MAX, 2, 0}}},  // rows beyond, by wrap-around
  };
  for (const auto& b : bad) {
    const absl::Status refused = call(b.group, b.segments);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_TRUE(call(gate_up, {{1, 0, 2, 0}, {experts - 1, 2, 2, 0}}).ok());
  }
  session->reset();
  service.Signal(SIGTERM);
  EXPECT_EQ(service.Wait(std::chrono::seconds(15)), 0) << service.Stderr();
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ResidualServiceMoeTest,
    ::testing::Values("tests/fixtures/oracle/qwen3moe_synthetic_logits.json",
                      "tests/fixtures/oracle/gemma4moe_synthetic_logits.json"));

}  // namespace
}  // namespace bitsplit
