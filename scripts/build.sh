#!/usr/bin/env bash
# Configures and builds into build/ (Release-with-debug-info, Ninja, ccache when present).
# Extra arguments go to CMake's configure step, e.g. -DBITSPLIT_CUDA=OFF.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_BUILD_DIR:-$ROOT/build}"
if [[ ! -f "$BUILD/build.ninja" || $# -gt 0 ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja "$@" >/dev/null
fi
ninja -C "$BUILD" -j"$(nproc)"
