#include "common/text/jinja_strings.h"

#include <algorithm>

#include "common/text/jinja_value.h"

namespace bitsplit::text::jinja {

std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, StripSide side) {
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  const std::vector<uint32_t> set = chars ? DecodeUtf8(*chars) : std::vector<uint32_t>{};
  auto strip = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : IsPythonSpace(cp);
  };
  size_t begin = 0;
  size_t end = cps.size();
  if (side != StripSide::kRight) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (side != StripSide::kLeft) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  return EncodeUtf8(std::vector<uint32_t>(cps.begin() + begin, cps.begin() + end));
}

std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 long long maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<long long>(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  size_t i = 0;
  while (true) {
    while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<long long>(out.size()) == maxsplit) {
      size_t end = cps.size();
      while (end > i && IsPythonSpace(cps[end - 1])) --end;
      out.push_back(EncodeUtf8(std::vector<uint32_t>(cps.begin() + i, cps.begin() + end)));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !IsPythonSpace(cps[j])) ++j;
    out.push_back(EncodeUtf8(std::vector<uint32_t>(cps.begin() + i, cps.begin() + j)));
    i = j;
  }
  return out;
}

std::vector<std::string> PyRSplit(std::string_view s, const std::optional<std::string>& sep,
                                  long long maxsplit) {
  if (maxsplit < 0) return PySplit(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (static_cast<long long>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::vector<std::string> all = PySplit(s, std::nullopt, -1);
  if (static_cast<long long>(all.size()) <= maxsplit + 1) return all;
  // The leftmost pieces stay joined with their original white space.
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  size_t end = cps.size();
  for (long long k = 0; k < maxsplit; ++k) {
    while (end > 0 && IsPythonSpace(cps[end - 1])) --end;
    size_t start = end;
    while (start > 0 && !IsPythonSpace(cps[start - 1])) --start;
    out.push_back(EncodeUtf8(std::vector<uint32_t>(cps.begin() + start, cps.begin() + end)));
    end = start;
  }
  size_t begin = 0;
  while (begin < end && IsPythonSpace(cps[begin])) ++begin;
  while (end > begin && IsPythonSpace(cps[end - 1])) --end;
  out.push_back(EncodeUtf8(std::vector<uint32_t>(cps.begin() + begin, cps.begin() + end)));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> PySplitlines(std::string_view s) {
  std::vector<std::string> out;
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  std::vector<uint32_t> line;
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t cp = cps[i];
    const bool is_break = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c ||
                          (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!is_break) {
      line.push_back(cp);
      continue;
    }
    if (cp == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    out.push_back(EncodeUtf8(line));
    line.clear();
  }
  if (!line.empty()) out.push_back(EncodeUtf8(line));
  return out;
}

std::string PyReplace(std::string_view s, std::string_view old, std::string_view replacement,
                      long long count) {
  std::string out;
  if (old.empty()) {
    const std::vector<uint32_t> cps = DecodeUtf8(s);
    long long done = 0;
    for (uint32_t cp : cps) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      AppendUtf8(cp, out);
    }
    if (count < 0 || done < count) out += replacement;
    return out;
  }
  size_t start = 0;
  long long done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out += s.substr(start, at - start);
    out += replacement;
    start = at + old.size();
    ++done;
  }
  out += s.substr(start);
  return out;
}

namespace {

// Simple case mappings (one code point to one) of the scripts PyUpper names.
uint32_t LowerOf(uint32_t cp) {
  if ((cp >= 'A' && cp <= 'Z') || (cp >= 0xc0 && cp <= 0xde && cp != 0xd7)) return cp + 32;
  if ((cp >= 0x100 && cp <= 0x137) || (cp >= 0x14a && cp <= 0x177)) {
    return cp == 0x130 ? 'i' : cp | 1;
  }
  if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17e)) {
    return cp % 2 == 1 ? cp + 1 : cp;
  }
  if (cp == 0x178) return 0xff;
  if (cp == 0x386) return 0x3ac;
  if (cp >= 0x388 && cp <= 0x38a) return cp + 37;
  if (cp == 0x38c) return 0x3cc;
  if (cp == 0x38e || cp == 0x38f) return cp + 63;
  if ((cp >= 0x391 && cp <= 0x3a1) || (cp >= 0x3a3 && cp <= 0x3ab)) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40f) return cp + 80;
  if (cp >= 0x410 && cp <= 0x42f) return cp + 32;
  return cp;
}

uint32_t UpperOf(uint32_t cp) {
  if ((cp >= 'a' && cp <= 'z') || (cp >= 0xe0 && cp <= 0xfe && cp != 0xf7)) return cp - 32;
  if (cp == 0xff) return 0x178;
  if (cp == 0xb5) return 0x39c;
  if (cp == 0x131) return 'I';
  if (cp == 0x17f) return 'S';
  if ((cp >= 0x100 && cp <= 0x137) || (cp >= 0x14a && cp <= 0x177)) {
    return cp == 0x130 ? cp : cp & ~1u;
  }
  if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17e)) {
    return cp % 2 == 0 ? cp - 1 : cp;
  }
  if (cp == 0x3ac) return 0x386;
  if (cp >= 0x3ad && cp <= 0x3af) return cp - 37;
  if (cp == 0x3cc) return 0x38c;
  if (cp == 0x3cd || cp == 0x3ce) return cp - 63;
  if (cp == 0x3c2) return 0x3a3;
  if ((cp >= 0x3b1 && cp <= 0x3c1) || (cp >= 0x3c3 && cp <= 0x3cb)) return cp - 32;
  if (cp >= 0x430 && cp <= 0x44f) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45f) return cp - 80;
  return cp;
}

// Python's full mappings where one code point becomes several.
void AppendUpper(uint32_t cp, std::string& out) {
  if (cp == 0xdf) {
    out += "SS";
  } else if (cp == 0x149) {
    AppendUtf8(0x2bc, out);
    out.push_back('N');
  } else {
    AppendUtf8(UpperOf(cp), out);
  }
}

void AppendLower(uint32_t cp, std::string& out) {
  AppendUtf8(LowerOf(cp), out);
  if (cp == 0x130) AppendUtf8(0x307, out);  // İ lowers to i and a combining dot
}

void AppendTitle(uint32_t cp, std::string& out) {
  if (cp == 0xdf) {
    out += "Ss";
  } else {
    AppendUpper(cp, out);
  }
}

bool IsCased(uint32_t cp) { return IsUpperLetter(cp) || IsLowerLetter(cp); }

}  // namespace

bool IsUpperLetter(uint32_t cp) { return LowerOf(cp) != cp || cp == 0x130; }

bool IsLowerLetter(uint32_t cp) {
  return UpperOf(cp) != cp || cp == 0xdf || cp == 0x138 || cp == 0x149;
}

std::string PyUpper(std::string_view s) {
  std::string out;
  for (uint32_t cp : DecodeUtf8(s)) AppendUpper(cp, out);
  return out;
}

std::string PyLower(std::string_view s) {
  std::string out;
  for (uint32_t cp : DecodeUtf8(s)) AppendLower(cp, out);
  return out;
}

std::string PyTitle(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (uint32_t cp : DecodeUtf8(s)) {
    if (previous_cased) {
      AppendLower(cp, out);
    } else {
      AppendTitle(cp, out);
    }
    previous_cased = IsCased(cp);
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (uint32_t cp : DecodeUtf8(s)) {
    if (first) {
      AppendTitle(cp, out);
    } else {
      AppendLower(cp, out);
    }
    first = false;
  }
  return out;
}

std::string JinjaTitle(std::string_view s) {
  std::string out;
  bool word_start = true;
  for (uint32_t cp : DecodeUtf8(s)) {
    const bool separator =
        cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || IsPythonSpace(cp);
    if (separator) {
      AppendUtf8(cp, out);
      word_start = true;
    } else if (word_start) {
      AppendUpper(cp, out);
      word_start = false;
    } else {
      AppendLower(cp, out);
    }
  }
  return out;
}

size_t PyLength(std::string_view s) { return DecodeUtf8(s).size(); }

size_t PyCount(std::string_view s, std::string_view needle) {
  if (needle.empty()) return PyLength(s) + 1;
  size_t n = 0;
  for (size_t at = s.find(needle); at != std::string_view::npos;
       at = s.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

}  // namespace bitsplit::text::jinja
