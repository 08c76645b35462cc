#!/usr/bin/env bash
# The whole test suite: installs what is missing (Debian packages, verified models), builds
# everything (CUDA code included where nvcc exists), and runs every test through CTest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_BUILD_DIR:-$ROOT/build}"
if [[ $(id -u) -eq 0 ]] || command -v sudo >/dev/null; then
  "$ROOT/scripts/setup.sh"
else
  "$ROOT/scripts/setup.sh" --models
fi
"$ROOT/scripts/build.sh"
ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)" --timeout 900
"$ROOT/scripts/sanitize.sh"          # the fast unit tests again, ASan + UBSan (clang)
"$ROOT/scripts/fuzz.sh" --seconds 30  # each libFuzzer target of tests/fuzz, ASan + UBSan
