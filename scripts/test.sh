#!/usr/bin/env bash
# The whole test suite: installs what is missing (Debian packages, verified models), checks the
# layer order of the includes and the clang-format of the sources, builds
# everything (CUDA code included where nvcc exists), and runs every test through CTest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_BUILD_DIR:-$ROOT/build}"
if [[ $(id -u) -eq 0 ]] || command -v sudo >/dev/null; then
  "$ROOT/scripts/setup.sh"
else
  "$ROOT/scripts/setup.sh" --models
fi
"$ROOT/scripts/check_layers.py"  # every project #include against the layer order
"$ROOT/scripts/check_format.sh"  # clang-format of every tracked source
"$ROOT/scripts/build.sh"
# The official openai client and prometheus_client for the HTTP API's tests (a cached venv).
BITSPLIT_TEST_PYTHON="$("$ROOT/scripts/test-venv.sh")"
export BITSPLIT_TEST_PYTHON
ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)" --timeout 900
"$ROOT/scripts/sanitize.sh"          # the fast unit tests again, ASan + UBSan (clang)
"$ROOT/scripts/fuzz.sh" --seconds 30  # each libFuzzer target of tests/fuzz, ASan + UBSan
