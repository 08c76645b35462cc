#!/usr/bin/env bash
# The acceptance and speed tables of docs/performance.md ("Speculative decoding"): quantizes the
# split models it needs (once, into ~/.cache/bitsplit/split), makes llama.cpp's Q2_K draft of
# SmolLM2 (once, via scripts/make_q2k_baseline.py), and runs bench/speculation_bench over the
# committed prompt set.
#   bench/speculation_study.sh [--model smollm2|gemma3] [--tokens 32] [--max-prompts N] [--json OUT]
# (extra args go to the bench; gemma3 = gemma-3-270m, without the Q2_K draft ablation)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_BUILD_DIR:-$ROOT/build}"
CACHE="${BITSPLIT_CACHE:-$HOME/.cache/bitsplit}"
NAME=smollm2
if [[ "${1:-}" == "--model" ]]; then
  NAME="$2"
  shift 2
fi
case "$NAME" in
  smollm2) MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
  gemma3) MODEL="$ROOT/models/gemma-3-270m-q4_k_m.gguf" ;;
  *) echo "speculation_study: --model must be smollm2 or gemma3, not '$NAME'" >&2; exit 2 ;;
esac
"$ROOT/scripts/build.sh" >/dev/null
mkdir -p "$CACHE/split"
splits=()
for bits in 2 4; do
  prefix="$CACHE/split/$NAME-b$bits"
  if [[ ! -f "$prefix.residual.bsplit" ]]; then
    echo "speculation_study: quantizing $MODEL (base $bits bits + r8)" >&2
    "$BUILD/tools/bitsplit/bitsplit" quantize "$MODEL" -o "$prefix" --base-bits "$bits" \
      --base-format asym --residual-bits 8 --group 64 --residual-group 32 --rotate \
      --rotate-block 64 --seed 1
  fi
  splits+=(--split "$prefix=b${bits}_asym+r8")
done
if [[ "$NAME" != smollm2 ]]; then
  exec "$BUILD/bench/speculation_bench" "${splits[@]}" "$@"
fi
Q2K="$CACHE/eval/SmolLM2-135M-Instruct.Q4_1.llama-q2_k.gguf"
if [[ ! -f "$Q2K" ]]; then
  echo "speculation_study: making llama.cpp's Q2_K draft (oracle venv)" >&2
  # shellcheck disable=SC2046
  $("$ROOT/scripts/oracle-env.sh") "$ROOT/scripts/make_q2k_baseline.py" --model "$MODEL" --out "$Q2K"
fi
exec "$BUILD/bench/speculation_bench" "${splits[@]}" --q2k "$Q2K" "$@"
