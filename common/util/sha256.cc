#include "common/util/sha256.h"

#include <openssl/evp.h>

#include "common/util/status_macros.h"

namespace bitsplit {

struct Sha256::Context {
  EVP_MD_CTX* evp;
};

Sha256::Sha256() : context_(new Context{EVP_MD_CTX_new()}) {
  // Allocation or initialization failures of a built-in digest mean a broken libcrypto.
  BITSPLIT_CHECK(context_->evp != nullptr);
  BITSPLIT_CHECK(EVP_DigestInit_ex(context_->evp, EVP_sha256(), nullptr) == 1);
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(context_->evp);
  delete context_;
}

void Sha256::Update(const void* data, size_t size) {
  BITSPLIT_CHECK(EVP_DigestUpdate(context_->evp, data, size) == 1);
}

Sha256Digest Sha256::Finish() {
  Sha256Digest digest;
  unsigned int length = 0;
  BITSPLIT_CHECK(EVP_DigestFinal_ex(context_->evp, digest.data(), &length) == 1);
  BITSPLIT_CHECK(length == digest.size());
  return digest;
}

Sha256Digest Sha256Of(const void* data, size_t size) {
  Sha256 hasher;
  hasher.Update(data, size);
  return hasher.Finish();
}

std::string Sha256Hex(const Sha256Digest& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * digest.size());
  for (uint8_t byte : digest) {
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 15]);
  }
  return hex;
}

}  // namespace bitsplit
