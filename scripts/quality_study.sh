#!/usr/bin/env bash
# Reproduces the quality study of docs/quality.md on SmolLM2 (about 40 minutes on 2 cores):
#   1. the corpus and calibration texts (scripts/make_eval_corpus.sh),
#   2. llama.cpp's own Q2_K of the original Q4_1 file (scripts/make_q2k_baseline.py, oracle venv),
#   3. the ablation (4,096 tokens) and the main table (20,480 tokens) with `bitsplit eval`.
# Outputs go to OUT (default ~/.cache/bitsplit/eval/study): *.md tables, *.json rows, *.log.
#
#   scripts/quality_study.sh [BUILD_DIR] [OUT]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/bitsplit/eval"
OUT="${2:-$CACHE/study}"
MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
BITSPLIT="$BUILD/tools/bitsplit/bitsplit"
THREADS="${THREADS:-2}"
mkdir -p "$OUT"

"$ROOT/scripts/make_eval_corpus.sh" "$CACHE"
PYTHON="$("$ROOT/scripts/oracle-env.sh")"
"$PYTHON" "$ROOT/scripts/make_q2k_baseline.py" --model "$MODEL" \
  --out "$CACHE/SmolLM2-135M-Instruct.Q4_1.llama-q2_k.gguf" | tail -n 14

run() {  # run NAME ARGS...
  local name="$1"
  shift
  "$BITSPLIT" eval -m "$MODEL" --text "$CACHE/corpus.txt" -t "$THREADS" \
    --json "$OUT/$name.json" "$@" >"$OUT/$name.md" 2>"$OUT/$name.log"
  cat "$OUT/$name.md"
}

# Ablation, 8 windows: group, symmetric/asymmetric, rotation, importance, residual group, the
# aligned b4 grid. Explicit groups (g64) so that the rows do not depend on the defaults.
run ablation --max-tokens 4096 --calibration "$CACHE/calibration.txt" --configs \
ref,b2+r6:g64,b2:g64,b2+r6:g32,b2:g32,b2+r6:g192,b2:g192,b2+r6:g64:sym,b2:g64:sym,\
b2+r6:g64:norot,b2:g64:norot,b2+r6:g64:imp,b2:g64:imp,b2+r6:bg64:rg192,b4:g32:asym:norot,\
b4:g32:asym:rot64
run ablation2 --max-tokens 4096 --configs b2+r6:bg32:rg64,b2+r6:bg64:rg32,b2:g64,b2:g64:hq8,q8_0

# Main table, 40 windows (20,440 scored positions), the chosen defaults.
run main --max-tokens 20480 --configs \
b2,b3,b4,b2+r6,b2+r8,b3+r6,b2+r6:rg192,q8_0,gguf:$CACHE/SmolLM2-135M-Instruct.Q4_1.llama-q2_k.gguf
