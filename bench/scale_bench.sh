#!/usr/bin/env bash
# The product at a 7B-class scale on this machine, side by side with llama.cpp in one run:
#   1. a qwen2 GGUF of Qwen2.5-7B's shapes with random Q8_0 weights and the real tokenizer
#      (bench/make_synthetic_gguf.py; cached);
#   2. bitsplit quantize: wall time, CPU seconds, peak anonymous RSS (RssAnon, polled every
#      0.2 s); with --compare-build DIR, the same with DIR's bitsplit (an older build) and the
#      ratio of CPU seconds; llama.cpp's Q8_0 -> Q4_K_M quantize of the same file (llama-cpp-python's
#      llama_model_quantize) as the yardstick;
#   3. the three services (scripts/start-services.sh): time to ready (the weights faulted in),
#      the first request's latency (1 token), then decode tokens/s with speculation off (every
#      token verified by base + residual) and with the draft tree;
#   4. llama.cpp's decode tokens/s on the same Q8_0 GGUF, same threads (bench/llamacpp_speed.py).
# Random weights: speed and memory only; the draft's acceptance on them says nothing.
#   bench/scale_bench.sh [--layers N] [--threads T] [--compare-build DIR] [--tokens N]
# --layers N: the first N of the 28 layers (a slice with the same per-layer shapes).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_BUILD_DIR:-$ROOT/build}"
CACHE="${BITSPLIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bitsplit}"
LAYERS=0 THREADS=$(nproc) COMPARE="" TOKENS=16
while [[ $# -gt 0 ]]; do
  case $1 in
    --layers) LAYERS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --compare-build) COMPARE=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    *) echo "scale_bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
say() { echo "scale_bench: $*" >&2; }
PY="$("$ROOT/scripts/oracle-env.sh" --exact-gelu)"  # gguf, numpy and llama-cpp-python
"$ROOT/scripts/build.sh" >&2
CLI="$BUILD/tools/bitsplit/bitsplit"
DIR="$CACHE/synthetic"
mkdir -p "$DIR"
name=qwen2.5-7b
[[ $LAYERS -gt 0 ]] && name+="-${LAYERS}l"
GGUF="$DIR/$name.Q8_0.gguf"
if [[ ! -f $GGUF ]]; then
  say "writing $GGUF"
  "$PY" "$ROOT/bench/make_synthetic_gguf.py" "$GGUF.tmp" --layers "$LAYERS" \
    --vocab "$ROOT/models/DeepSeek-R1-Distill-Qwen-7B.vocab.gguf"
  mv "$GGUF.tmp" "$GGUF"
fi

# Quantizes $GGUF with BINARY into PREFIX; prints "WALL_S CPU_S PEAK_ANON_GIB" (CPU: user +
# system of the process, from /usr/bin/time; peak anonymous RSS polled every 0.2 s).
quantize_run() {  # BINARY PREFIX
  local binary=$1 prefix=$2 peak=0 rss
  local t0 t1 user system child
  t0=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$DIR/time.txt" "$binary" quantize "$GGUF" -o "$prefix" \
    -t "$THREADS" >"$DIR/quantize.log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    child=$(pgrep -P "$pid" | head -n 1 || true)
    if [[ -n $child ]]; then
      rss=$(awk '/^RssAnon:/ {print $2}' "/proc/$child/status" 2>/dev/null || echo 0)
      ((${rss:-0} > peak)) && peak=$rss
    fi
    sleep 0.2
  done
  wait "$pid" || { tail -n 20 "$DIR/quantize.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  read -r user system <"$DIR/time.txt"
  python3 -c "print(f'{$t1 - $t0:.1f} {$user + $system:.1f} {$peak / 1048576:.2f}')"
}

say "quantizing $GGUF with $THREADS threads"
read -r q_wall q_cpu q_rss < <(quantize_run "$CLI" "$DIR/$name")
if [[ -n $COMPARE ]]; then
  say "quantizing with $COMPARE's bitsplit"
  read -r o_wall o_cpu o_rss < <(quantize_run "$COMPARE/tools/bitsplit/bitsplit" "$DIR/$name.compare")
  rm -f "$DIR/$name.compare".*.bsplit
fi
say "llama.cpp: Q8_0 -> Q4_K_M of the same file"
l_wall=$("$PY" - "$GGUF" "$DIR/$name.Q4_K_M.gguf" "$THREADS" <<'PYEOF'
import ctypes, sys, time
import llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
params.nthread = int(sys.argv[3])
params.allow_requantize = True
start = time.time()
if llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)) != 0:
    sys.exit("llama_model_quantize failed")
print(f"{time.time() - start:.1f}")
PYEOF
)
rm -f "$DIR/$name.Q4_K_M.gguf"

export BITSPLIT_RUN_DIR="$DIR/run" BITSPLIT_LISTEN=localhost:50161 BITSPLIT_HTTP=""
export BITSPLIT_START_TIMEOUT_S=1800
t0=$(date +%s.%N)
"$ROOT/scripts/start-services.sh" start --model "$DIR/$name" >&2
t1=$(date +%s.%N)
trap '"$ROOT/scripts/start-services.sh" stop >&2' EXIT
prompt="Write a short story about a lighthouse keeper."
f0=$(date +%s.%N)
"$CLI" generate --server "$BITSPLIT_LISTEN" --prompt "$prompt" -n 1 --speculation off >/dev/null 2>&1
f1=$(date +%s.%N)
tokens_per_s() {  # SPECULATION...
  "$CLI" generate --server "$BITSPLIT_LISTEN" --prompt "$prompt" -n "$TOKENS" "$@" \
    2>"$DIR/generate.stats" >/dev/null
  sed -nE 's/.*\| ([0-9]+) tokens, ([0-9.]+) tok\/s.*/\2/p' "$DIR/generate.stats" | tail -n 1
}
off=$(tokens_per_s --speculation off)
tree=$(tokens_per_s --speculation tree --nodes 16 --expansions 4 --max-depth 8)
"$ROOT/scripts/start-services.sh" stop >&2
trap - EXIT
say "llama.cpp: decode on the same Q8_0 file"
llama=$("$PY" "$ROOT/bench/llamacpp_speed.py" --model "$GGUF" --threads "$THREADS" \
  --prompt-tokens 32 --decode-tokens "$TOKENS" --repeats 1)
llama_decode=$(python3 -c 'import json,sys; print("%.2f" % json.loads(sys.argv[1])["decode_tokens_per_s"])' "$llama")

gib=$(python3 -c "import os; print(f'{os.path.getsize(\"$GGUF\") / 2**30:.2f}')")
echo "model $name (random Q8_0, $gib GiB), $THREADS threads, $(nproc) cores"
echo "| step | bitsplit | llama.cpp |"
echo "|---|---|---|"
echo "| quantize: wall s / CPU s / peak anon GiB | $q_wall / $q_cpu / $q_rss | Q8_0 -> Q4_K_M $l_wall s wall |"
if [[ -n $COMPARE ]]; then
  ratio=$(python3 -c "print(f'{$o_cpu / $q_cpu:.2f}')")
  echo "| quantize with $COMPARE: wall s / CPU s / peak anon GiB | $o_wall / $o_cpu / $o_rss (CPU x$ratio) | |"
fi
python3 -c "print(f'| start to ready (weights faulted in) | {$t1 - $t0:.1f} s | |')"
python3 -c "print(f'| first request, 1 token | {$f1 - $f0:.2f} s | |')"
echo "| decode tok/s, speculation off (verify every token) | $off | $llama_decode |"
echo "| decode tok/s, tree 16/4/8 | $tree | |"
