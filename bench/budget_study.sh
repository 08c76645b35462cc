#!/usr/bin/env bash
# Bits by budget (docs/quality.md and docs/performance.md, "Bits by budget"): for base-weight
# budgets of 25%, 40% and 60% of the model's linear weights in Q8_0 (`--vram-budget N%`: the KV
# cache, scratch and tables of the default drafter plan come on top), `bitsplit quantize` plans
# and writes the model; `bitsplit eval` measures every plan's verifier and draft beside our Q8_0
# and the uniform b2+r6 and b2+r8 splits on the eval corpus; speculation_bench measures tokens per
# verify (16-node tree, 64-node tree, 8-chain) on the prompt set. A budget nothing fits is
# recorded with quantize's refusal.
#
#   bench/budget_study.sh [--model smollm2|gemma3] [--out DIR] [--max-prompts N] [--tokens N]
#
# Writes DIR/plan-N.{log,json}, DIR/eval-{uniform,plans}.json and
# DIR/speculation-{uniform,plans}.json, then prints the table (bench/budget_table.py). The
# uniform splits' measurements do not depend on the allocator: a rerun into the same DIR keeps
# them and measures only the plans.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_BUILD_DIR:-$ROOT/build}"
CACHE="${BITSPLIT_CACHE:-$HOME/.cache/bitsplit}"
NAME=smollm2
OUT=""
MAX_PROMPTS=16
TOKENS=32
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) NAME="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --max-prompts) MAX_PROMPTS="$2"; shift 2 ;;
    --tokens) TOKENS="$2"; shift 2 ;;
    *) echo "budget_study: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$NAME" in
  smollm2) MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
  gemma3) MODEL="$ROOT/models/gemma-3-270m-q4_k_m.gguf" ;;
  *) echo "budget_study: --model must be smollm2 or gemma3, not '$NAME'" >&2; exit 2 ;;
esac
OUT="${OUT:-$CACHE/budget/$NAME}"
mkdir -p "$OUT"
CALIB="$CACHE/eval/calibration.txt"
TEXT="$CACHE/eval/corpus.txt"
[[ -f "$CALIB" && -f "$TEXT" ]] || "$ROOT/scripts/make_eval_corpus.sh" "$CACHE/eval"
"$ROOT/scripts/build.sh" >/dev/null
BITSPLIT="$BUILD/tools/bitsplit/bitsplit"
cd "$ROOT"  # speculation_bench reads bench/prompts/ relative to here

plan_evals=()
plan_splits=()
for pct in 25 40 60; do
  prefix="$OUT/v$pct"
  echo "budget_study: --vram-budget $pct%" >&2
  if "$BITSPLIT" quantize "$MODEL" -o "$prefix" --vram-budget "$pct%" --calib "$CALIB" \
    --plan-json "$OUT/plan-$pct.json" >"$OUT/plan-$pct.log" 2>&1; then
    plan_evals+=("split:$prefix" "split-base:$prefix")
    plan_splits+=(--split "$prefix=plan $pct%")
  else
    rm -f "$OUT/plan-$pct.json" "$prefix.base.bsplit" "$prefix.residual.bsplit"
    echo "budget_study: $pct%: $(tail -1 "$OUT/plan-$pct.log")" >&2
  fi
done

# measure NAME CONFIGS SPLIT...: bitsplit eval of CONFIGS (comma-separated) into eval-NAME.json
# and speculation_bench of the splits into speculation-NAME.json.
measure() {
  local name="$1" configs="$2"
  shift 2
  echo "budget_study: measuring the $name configurations" >&2
  "$BITSPLIT" eval --model "$MODEL" --text "$TEXT" --max-tokens 4096 --calibration "$CALIB" \
    --configs "$configs" --json "$OUT/eval-$name.json" >"$OUT/eval-$name.log" 2>&1
  "$BUILD/bench/speculation_bench" "$@" --deep-tree --no-own-kv \
    --max-prompts "$MAX_PROMPTS" --tokens "$TOKENS" --json "$OUT/speculation-$name.json" \
    >"$OUT/speculation-$name.log" 2>&1
}

if [[ ! -f "$OUT/speculation-uniform.json" ]]; then
  uniform_splits=()
  for r in 6 8; do
    prefix="$OUT/b2r$r"
    [[ -f "$prefix.residual.bsplit" ]] ||
      "$BITSPLIT" quantize "$MODEL" -o "$prefix" --base-bits 2 --residual-bits "$r" \
        --calib "$CALIB" >"$OUT/b2r$r.log" 2>&1
    uniform_splits+=(--split "$prefix=b2_asym+r$r")
  done
  measure uniform "q8_0:norot,b2+r6:imp,b2+r8:imp,b2:imp" "${uniform_splits[@]}"
fi
if [[ ${#plan_splits[@]} -gt 0 ]]; then
  measure plans "$(IFS=,; echo "${plan_evals[*]}")" "${plan_splits[@]}"
else
  rm -f "$OUT/eval-plans.json" "$OUT/speculation-plans.json"
fi
python3 "$ROOT/bench/budget_table.py" "$OUT"
