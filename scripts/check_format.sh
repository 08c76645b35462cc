#!/usr/bin/env bash
# Fails if any tracked C++/CUDA source of common, services, tools, bench or tests (*.h *.cc *.cu
# *.inc) differs from what clang-format makes of it under .clang-format. clang-format 14 (the
# version of the clang that scripts/setup.sh installs); CLANG_FORMAT names another binary.
# To fix a file: clang-format-14 -i FILE.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLANG_FORMAT="${CLANG_FORMAT:-clang-format-14}"
command -v "$CLANG_FORMAT" >/dev/null || {
  echo "check_format: $CLANG_FORMAT not found (scripts/setup.sh --packages installs it)" >&2
  exit 1
}
cd "$ROOT"
files=()
while IFS= read -r -d '' f; do
  [[ -f "$f" ]] && files+=("$f")  # a tracked file deleted in the working tree is skipped
done < <(git ls-files -z -- common services tools bench tests | grep -zE '\.(h|cc|cu|inc)$')
bad=()
for f in "${files[@]}"; do
  "$CLANG_FORMAT" --dry-run -Werror "$f" || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} file(s) not clang-formatted: ${bad[*]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files clang-formatted" >&2
