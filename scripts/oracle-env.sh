#!/usr/bin/env bash
# Creates the Python environment of the test oracles (gguf, llama-cpp-python built from source)
# in the per-user cache. Only needed to regenerate committed fixtures or to run the llama.cpp
# side of the benchmarks; CI and the main job never need it. Prints the python path.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${BITSPLIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bitsplit}"
VENV="$CACHE/oracle-venv"
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import llama_cpp, gguf" 2>/dev/null; then
  echo "oracle-env: installing pinned oracle packages (llama.cpp compiles from source: minutes)" >&2
  CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$VENV/bin/pip" install -q --require-hashes -r "$ROOT/tests/oracle/requirements.txt" >&2
fi
echo "$VENV/bin/python"
