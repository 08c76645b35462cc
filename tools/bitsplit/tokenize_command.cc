// `bitsplit tokenize`: the token ids of a text under a model's tokenizer, printed the way
// llama.cpp's llama-tokenize prints them. Only the vocabulary is read, so it works on a GGUF that
// holds metadata and no tensors, and on a split model's base file (the source GGUF's metadata
// embedded in it).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/io/gguf.h"
#include "common/io/split_file.h"
#include "common/model/split_model.h"
#include "common/text/tokenizer.h"
#include "tools/bitsplit/commands.h"

namespace bitsplit::cli {
namespace {

struct TokenizeOptions {
  std::string model_path;
  std::optional<std::string> text;
  bool parse_special = false;
  bool json = false;
  bool no_bos = false;
};

int Fail(int code, std::string_view message) { return ReportError("tokenize", code, message); }

// The model's metadata, from either kind of file. Both objects stay alive for the tokenizer:
// `split` owns the mapping the embedded metadata points into.
struct Metadata {
  std::unique_ptr<gguf::File> gguf;
  std::unique_ptr<model::SplitModelFiles> split;
  const gguf::File& file() const { return split ? split->gguf_metadata() : *gguf; }
};

absl::StatusOr<Metadata> OpenMetadata(const std::string& path) {
  std::FILE* stream = std::fopen(path.c_str(), "rb");
  if (stream == nullptr) {
    return absl::NotFoundError(absl::StrFormat("cannot open %s: %s", path, std::strerror(errno)));
  }
  char magic[sizeof(kSplitFileMagic)] = {};
  const size_t read = std::fread(magic, 1, sizeof(magic), stream);
  std::fclose(stream);
  Metadata metadata;
  if (read == sizeof(magic) && std::memcmp(magic, kSplitFileMagic, sizeof(magic)) == 0) {
    auto split = model::SplitModelFiles::Open(path, /*residual_path=*/"");
    if (!split.ok()) return split.status();
    metadata.split = std::move(*split);
  } else {
    auto file = gguf::File::Open(path);
    if (!file.ok()) return file.status();
    metadata.gguf = std::move(*file);
  }
  return metadata;
}

int RunTokenize(const TokenizeOptions& options) {
  auto metadata = OpenMetadata(options.model_path);
  if (!metadata.ok()) return Fail(kExitBadInput, std::string(metadata.status().message()));
  auto tokenizer = text::Tokenizer::FromGguf(metadata->file());
  if (!tokenizer.ok()) return Fail(kExitBadInput, std::string(tokenizer.status().message()));

  std::string text;
  if (options.text) {
    text = *options.text;
  } else {
    std::ostringstream buffer;
    buffer << std::cin.rdbuf();
    if (std::cin.bad()) return Fail(kExitFailure, "could not read the standard input");
    text = buffer.str();
  }

  // llama-tokenize: BOS (and EOS) as the model asks unless --no-bos.
  const std::vector<int32_t> ids =
      (*tokenizer)->Tokenize(text, /*add_special=*/!options.no_bos, options.parse_special);
  if (options.json) {
    std::printf("[%s]\n", absl::StrJoin(ids, ", ").c_str());
    return kExitOk;
  }
  for (int32_t id : ids) {
    // Ids come from the tokenizer, so the piece always exists; the bytes go out as they are
    // (a piece can hold part of a UTF-8 character), as llama-tokenize writes them.
    const std::string_view piece = *(*tokenizer)->TokenToPiece(id, /*render_special=*/true);
    std::printf("%6d -> '", id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::printf("'\n");
  }
  return kExitOk;
}

}  // namespace

Command AddTokenizeCommand(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* sub = app.add_subcommand(
      "tokenize",
      "print the token ids of a text (like llama.cpp's llama-tokenize); reads only "
      "the vocabulary of a GGUF or split base file");
  sub->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sub->add_option("--model,-m", options->model_path,
                  "GGUF file (tensors not needed) or split base file (.base.bsplit)")
      ->required();
  sub->add_option("--text", options->text, "the text, verbatim (default: read standard input)");
  sub->add_flag("--special", options->parse_special,
                "parse special tokens: text such as <|im_start|> becomes that token");
  sub->add_flag("--json", options->json, "print the ids as one JSON array");
  sub->add_flag("--no-bos", options->no_bos,
                "add neither BOS nor EOS, even where the model asks for them");
  return {sub, [options] { return RunTokenize(*options); }};
}

}  // namespace bitsplit::cli
