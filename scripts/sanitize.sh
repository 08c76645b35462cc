#!/usr/bin/env bash
# Builds the fast unit tests (tests/ io_*, quant_*, ops_*, text_*, util_*, model_config,
# model_sampler, model_kv_cache; tests/fuzz/CMakeLists.txt has the list) in the clang tree
# build-fuzz with ASan + UBSan (-fno-sanitize-recover=undefined: the first report fails the test)
# and runs them through CTest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DBITSPLIT_FUZZ=ON -DBITSPLIT_CUDA=OFF
fi
flock /tmp/bitsplit-build.lock cmake --build "$BUILD" --target sanitized_tests
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}" \
  ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)" --timeout 900
