#include "common/offline/calibration.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/model/llama_model.h"
#include "common/text/tokenizer.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"

namespace bitsplit::offline {

absl::StatusOr<Calibration> CalibrateFromTextFile(const std::string& gguf_path,
                                                  const std::string& text_path,
                                                  const model::HadamardRotation& rotation,
                                                  int64_t max_tokens, int64_t window,
                                                  int num_threads) {
  std::ifstream in(text_path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(absl::StrFormat("cannot read calibration file %s", text_path));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> source,
                            model::LlamaModel::Load(gguf_path, num_threads));
  BITSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<text::Tokenizer> tokenizer,
                            text::Tokenizer::FromGguf(source->gguf_metadata()));
  std::vector<int32_t> tokens = tokenizer->Encode(text, /*parse_special=*/false);
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("calibration file %s holds no text", text_path));
  }
  if (max_tokens > 0 && static_cast<int64_t>(tokens.size()) > max_tokens) {
    tokens.resize(static_cast<size_t>(max_tokens));
  }
  const int32_t bos = tokenizer->add_bos() ? tokenizer->bos_id() : -1;
  BITSPLIT_ASSIGN_OR_RETURN(Calibration calibration,
                            CollectCalibration(*source, tokens, window, bos, rotation));
  // The hash covers the whole file; with the token count it identifies what was run.
  calibration.text_sha256 = Sha256Hex(Sha256Of(text.data(), text.size()));
  return calibration;
}

}  // namespace bitsplit::offline
