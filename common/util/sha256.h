#pragma once
// SHA-256 (OpenSSL libcrypto): fingerprints of split models and of their calibration data.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace bitsplit {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental hasher. Thread safety: none; one hasher per thread.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size);
  void Update(const std::string& text) { Update(text.data(), text.size()); }
  // The digest of everything passed to Update. The hasher cannot be used afterwards.
  Sha256Digest Finish();

 private:
  struct Context;
  Context* context_;  // an EVP_MD_CTX; opaque so that callers need no OpenSSL headers
};

Sha256Digest Sha256Of(const void* data, size_t size);
std::string Sha256Hex(const Sha256Digest& digest);  // 64 lowercase hex digits

}  // namespace bitsplit
