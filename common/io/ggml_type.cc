#include "common/io/ggml_type.h"

#include "absl/strings/str_cat.h"

namespace bitsplit {

std::optional<GgmlTypeTraits> GetGgmlTypeTraits(uint32_t type_id) {
  switch (type_id) {
    case 0:
      return GgmlTypeTraits{"F32", 1, 4};
    case 1:
      return GgmlTypeTraits{"F16", 1, 2};
    case 2:
      return GgmlTypeTraits{"Q4_0", 32, 18};
    case 3:
      return GgmlTypeTraits{"Q4_1", 32, 20};
    case 6:
      return GgmlTypeTraits{"Q5_0", 32, 22};
    case 7:
      return GgmlTypeTraits{"Q5_1", 32, 24};
    case 8:
      return GgmlTypeTraits{"Q8_0", 32, 34};
    case 9:
      return GgmlTypeTraits{"Q8_1", 32, 36};
    case 10:
      return GgmlTypeTraits{"Q2_K", 256, 84};
    case 11:
      return GgmlTypeTraits{"Q3_K", 256, 110};
    case 12:
      return GgmlTypeTraits{"Q4_K", 256, 144};
    case 13:
      return GgmlTypeTraits{"Q5_K", 256, 176};
    case 14:
      return GgmlTypeTraits{"Q6_K", 256, 210};
    case 15:
      return GgmlTypeTraits{"Q8_K", 256, 292};
    case 16:
      return GgmlTypeTraits{"IQ2_XXS", 256, 66};
    case 17:
      return GgmlTypeTraits{"IQ2_XS", 256, 74};
    case 18:
      return GgmlTypeTraits{"IQ3_XXS", 256, 98};
    case 19:
      return GgmlTypeTraits{"IQ1_S", 256, 50};
    case 20:
      return GgmlTypeTraits{"IQ4_NL", 32, 18};
    case 21:
      return GgmlTypeTraits{"IQ3_S", 256, 110};
    case 22:
      return GgmlTypeTraits{"IQ2_S", 256, 82};
    case 23:
      return GgmlTypeTraits{"IQ4_XS", 256, 136};
    case 24:
      return GgmlTypeTraits{"I8", 1, 1};
    case 25:
      return GgmlTypeTraits{"I16", 1, 2};
    case 26:
      return GgmlTypeTraits{"I32", 1, 4};
    case 27:
      return GgmlTypeTraits{"I64", 1, 8};
    case 28:
      return GgmlTypeTraits{"F64", 1, 8};
    case 29:
      return GgmlTypeTraits{"IQ1_M", 256, 56};
    case 30:
      return GgmlTypeTraits{"BF16", 1, 2};
    case 34:
      return GgmlTypeTraits{"TQ1_0", 256, 54};
    case 35:
      return GgmlTypeTraits{"TQ2_0", 256, 66};
    case 39:
      return GgmlTypeTraits{"MXFP4", 32, 17};
    case 40:
      return GgmlTypeTraits{"NVFP4", 64, 36};
    case 41:
      return GgmlTypeTraits{"Q1_0", 128, 18};
    default:
      return std::nullopt;
  }
}

std::string GgmlTypeName(uint32_t type_id) {
  auto traits = GetGgmlTypeTraits(type_id);
  if (traits) return std::string(traits->name);
  return absl::StrCat("type#", type_id);
}

}  // namespace bitsplit
