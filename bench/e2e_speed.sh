#!/usr/bin/env bash
# Tokens/s of speculative vs off through the three real processes (scripts/start-services.sh),
# side by side in one run: for each of the first N prompts of bench/prompts/prompts.jsonl, one
# greedy generation per setting, the settings interleaved per prompt (in a rotating order) so that
# load drifts hit all of them alike. Decode tokens/s per setting = total tokens / total decode time, from the stats
# line of `bitsplit generate --server`. Also checks that every setting emitted the same text
# (losslessness through the services).
#   bench/e2e_speed.sh [N_PROMPTS=8] [TOKENS=32] [MODEL_PREFIX]
# The services must not be running already (the script starts and stops its own, in
# $BITSPLIT_RUN_DIR, default /tmp/bitsplit-e2e-speed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_BUILD_DIR:-$ROOT/build}"
N=${1:-8}
TOKENS=${2:-32}
export BITSPLIT_RUN_DIR="${BITSPLIT_RUN_DIR:-/tmp/bitsplit-e2e-speed}"
export BITSPLIT_LISTEN="${BITSPLIT_LISTEN:-localhost:50151}"
start_args=()
[[ $# -ge 3 ]] && start_args=(--model "$3")
"$ROOT/scripts/start-services.sh" start "${start_args[@]}" >&2
trap '"$ROOT/scripts/start-services.sh" stop >&2' EXIT
CLI="$BUILD/tools/bitsplit/bitsplit"
SETTINGS=("off" "adaptive" "tree:16:4:8" "tree:8:1:8")
declare -A tokens seconds
for s in "${SETTINGS[@]}"; do tokens[$s]=0; seconds[$s]=0; done
mismatches=0
count=0
while IFS= read -r line && [[ $count -lt $N ]]; do
  id=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["id"])' "$line")
  prompt=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["prompt"])' "$line")
  case $id in code-* | prose-*) input=(--prompt "$prompt") ;; *) input=(--chat "$prompt") ;; esac
  reference=""
  # Rotate the order per prompt, so that no setting always runs first (or after another).
  order=("${SETTINGS[@]:count%${#SETTINGS[@]}}" "${SETTINGS[@]:0:count%${#SETTINGS[@]}}")
  for s in "${order[@]}"; do
    IFS=: read -r mode nodes k depth <<<"$s"
    spec=(--speculation "$mode")
    [[ $mode == tree ]] && spec+=(--nodes "$nodes" --expansions "$k" --max-depth "$depth")
    out=$("$CLI" generate --server "$BITSPLIT_LISTEN" "${input[@]}" -n "$TOKENS" "${spec[@]}" 2>/tmp/e2e_speed.stats)
    stats=$(tail -n 1 /tmp/e2e_speed.stats)
    # "[prompt 38 tokens | 48 tokens, 25.9 tok/s | spec ..."
    read -r n tps < <(sed -E 's/.*\| ([0-9]+) tokens, ([0-9.]+) tok\/s.*/\1 \2/' <<<"$stats")
    tokens[$s]=$((tokens[$s] + n))
    seconds[$s]=$(python3 -c "print(${seconds[$s]} + $n / max($tps, 1e-9))")
    if [[ -z $reference ]]; then reference=$out; elif [[ $out != "$reference" ]]; then
      echo "MISMATCH: $id under $s differs from ${order[0]}" >&2; mismatches=$((mismatches + 1))
    fi
    echo "$id $s: $stats" >&2
  done
  count=$((count + 1))
done <"$ROOT/bench/prompts/prompts.jsonl"
off_tps=$(python3 -c "print(${tokens[off]} / ${seconds[off]})")
echo "| setting | tokens | decode tok/s | vs off |"
echo "|---|---|---|---|"
for s in "${SETTINGS[@]}"; do
  python3 -c "t=${tokens[$s]}; sec=${seconds[$s]}; print(f'| $s | {t} | {t/sec:.1f} | {t/sec/$off_tps:.2f}x |')"
done
echo "prompts: $count x <= $TOKENS tokens (greedy); outputs differing from off: $mismatches"
[[ $mismatches -eq 0 ]]
