#pragma once
// Importance weights for the base fit of `bitsplit quantize` from a calibration text file, shared
// by the commands that quantize (quantize, eval). Lives here rather than in common/model because
// it needs the tokenizer (common/text), which the model layer does not depend on.
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/split_backend.h"
#include "common/offline/split_quantizer.h"

namespace bitsplit::offline {

// Tokenizes the text file with the GGUF's tokenizer (no special tokens), keeps the first
// `max_tokens` tokens (0: all), and runs the GGUF model over them in windows of `window` tokens
// (each starting with BOS when the tokenizer adds one), collecting per-column mean squared group
// inputs in the space of `rotation`. The result carries the text's SHA-256. NOT_FOUND for an
// unreadable file, INVALID_ARGUMENT for a file without text or a bad window.
absl::StatusOr<Calibration> CalibrateFromTextFile(const std::string& gguf_path,
                                                  const std::string& text_path,
                                                  const model::HadamardRotation& rotation,
                                                  int64_t max_tokens, int64_t window,
                                                  int num_threads);

}  // namespace bitsplit::offline
