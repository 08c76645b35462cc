#!/usr/bin/env bash
# Creates the Python environment of the test oracles (gguf, llama-cpp-python built from source)
# in the per-user cache. Only needed to regenerate committed fixtures or to run the llama.cpp
# side of the benchmarks; CI and the main job never need it. Prints the python path.
#
#   scripts/oracle-env.sh               llama.cpp as released (its CPU GELU is a lookup table at
#                                       the input rounded to fp16: GGML_GELU_FP16 in vec.h)
#   scripts/oracle-env.sh --exact-gelu  the same hash-verified llama.cpp with GGML_GELU_FP16 not
#                                       defined, so its CPU GELU is the f32 formula
#                                       0.5x(1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) that its
#                                       CUDA and Metal backends compute; nothing else changes
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${BITSPLIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bitsplit}"
REQUIREMENTS="$ROOT/tests/oracle/requirements.txt"
CMAKE_ARGS_ORACLE="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF"
variant="${1:-}"
case "$variant" in
  "") VENV="$CACHE/oracle-venv" ;;
  --exact-gelu) VENV="$CACHE/oracle-venv-exact-gelu" ;;
  *) echo "oracle-env: unknown option $variant (expected --exact-gelu or nothing)" >&2; exit 2 ;;
esac
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import llama_cpp, gguf" 2>/dev/null; then
  echo "oracle-env: installing pinned oracle packages (llama.cpp compiles from source: minutes)" >&2
  if [[ -z "$variant" ]]; then
    CMAKE_ARGS="$CMAKE_ARGS_ORACLE" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$VENV/bin/pip" install -q --require-hashes -r "$REQUIREMENTS" >&2
  else
    # Every pinned package but llama-cpp-python, then its sdist (hash-checked by pip download),
    # patched, built from the unpacked tree.
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    grep -v '^llama_cpp_python==' "$REQUIREMENTS" >"$work/requirements.txt"
    "$VENV/bin/pip" install -q --require-hashes -r "$work/requirements.txt" >&2
    grep '^llama_cpp_python==' "$REQUIREMENTS" >"$work/llama.txt"
    "$VENV/bin/pip" download -q --no-deps --no-binary=:all: --require-hashes -r "$work/llama.txt" \
      -d "$work" >&2
    tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
    vec_h=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp/ggml/src/ggml-cpu/vec.h)
    [[ $(grep -c '^#define GGML_GELU_FP16$' "$vec_h") == 1 ]] ||
      { echo "oracle-env: $vec_h does not define GGML_GELU_FP16 once" >&2; exit 1; }
    sed -i 's|^#define GGML_GELU_FP16$|// GGML_GELU_FP16 not defined: the f32 GELU formula (oracle-env.sh --exact-gelu)|' "$vec_h"
    CMAKE_ARGS="$CMAKE_ARGS_ORACLE" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$VENV/bin/pip" install -q --no-deps "$work"/llama_cpp_python-*/ >&2
  fi
fi
echo "$VENV/bin/python"
