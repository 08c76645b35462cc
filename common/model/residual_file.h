#pragma once
// A residual split file on its own, as a residual service holds it: without the base file (which
// carries the config), so the layer count and every shape come from the tensors, checked against
// the file's quantization record, and the group a request names.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/split_file.h"
#include "common/model/linear_backend.h"
#include "common/model/remote_residual.h"
#include "common/model/split_backend.h"
#include "common/model/split_model.h"

namespace bitsplit::model {

// One group of a residual file.
struct ResidualGroup {
  LinearGroupId id;
  std::vector<quant::MatrixView> matrices;  // output order; views into the mapped file
  std::vector<std::string> names;           // tensor names, output order
  int64_t cols = 0;                         // input width, shared by the matrices
  int64_t total_rows = 0;                   // sum of the matrices' rows
  uint64_t bytes = 0;                       // bytes of the matrices in the file
};

// Thread safety: immutable after Open.
class ResidualFile {
 public:
  // Opens `path` as a residual split file and checks every tensor against its quantization
  // record. INVALID_ARGUMENT (naming file and tensor) for a corrupt file, one that is not a
  // residual, or a tensor of another format or shape.
  static absl::StatusOr<std::unique_ptr<ResidualFile>> Open(const std::string& path);

  const SplitFile& file() const { return *file_; }
  const SplitQuantization& quantization() const { return quantization_; }
  const std::string& quantization_string() const { return quantization_string_; }
  int32_t num_layers() const { return num_layers_; }
  const std::vector<ResidualGroup>& groups() const { return groups_; }  // AllLinearGroups order
  const ResidualShapes& shapes() const { return shapes_; }
  uint64_t weight_bytes() const { return weight_bytes_; }

  // The group a request names, after checking every field: layer in range (or -1 with the
  // head), a known group, 1 <= rows <= max_rows, cols equal to the group's input width.
  // INVALID_ARGUMENT naming the field otherwise.
  absl::StatusOr<const ResidualGroup*> FindGroup(int64_t layer, int64_t group, int64_t rows,
                                                 int64_t cols, int64_t max_rows) const;

 private:
  ResidualFile() = default;
  absl::Status LoadGroups();

  std::unique_ptr<SplitFile> file_;
  SplitQuantization quantization_;
  std::string quantization_string_;
  int32_t num_layers_ = 0;
  std::vector<ResidualGroup> groups_;
  ResidualShapes shapes_;
  uint64_t weight_bytes_ = 0;
};

}  // namespace bitsplit::model
