#include "services/gpu-drafter/drafter_engine.h"

#include <filesystem>
#include <system_error>

namespace bitsplit::drafter {
namespace {

uint64_t FileBytes(const std::string& path) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  return error ? 0 : static_cast<uint64_t>(size);
}

}  // namespace

EngineInfo SplitModelInfo(const model::SplitModelFiles& files, const std::string& base_path,
                          const std::string& residual_path) {
  EngineInfo info;
  auto general_name = files.gguf_metadata().GetString("general.name");
  info.model_name =
      general_name.ok() ? *general_name : std::filesystem::path(base_path).filename().string();
  info.config = files.config();
  info.base_format = model::SplitQuantizationString(files.quantization());
  info.fingerprint = files.base().fingerprint_hex();
  info.base_bytes = FileBytes(base_path);
  if (!residual_path.empty()) {
    info.residual_in_process = true;
    info.residual_format = info.base_format;
    info.residual_bytes = FileBytes(residual_path);
  }
  return info;
}

}  // namespace bitsplit::drafter
