#!/usr/bin/env bash
# Time to first token per turn of a 6-turn conversation with and without the drafter's prefix
# cache, through the three real processes (scripts/start-services.sh), side by side in one run:
# bench/prefix_cache_turns.py sends each turn with `cache_prompt` true, then false, and checks
# that the answers are equal.
#   bench/prefix_cache.sh [TURNS=6] [ANSWER_TOKENS=128] [MODEL_PREFIX]
# The services must not be running already (the script starts and stops its own, in
# $BITSPLIT_RUN_DIR, default /tmp/bitsplit-prefix-cache); the drafter gets a 4096-token context so
# that the whole conversation fits.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TURNS=${1:-6}
ANSWER_TOKENS=${2:-128}
export BITSPLIT_RUN_DIR="${BITSPLIT_RUN_DIR:-/tmp/bitsplit-prefix-cache}"
export BITSPLIT_LISTEN="${BITSPLIT_LISTEN:-localhost:50161}"
export BITSPLIT_HTTP="${BITSPLIT_HTTP:-localhost:50162}"
mkdir -p "$BITSPLIT_RUN_DIR"
env_file="$BITSPLIT_RUN_DIR/bitsplit.env"
sed 's/^BITSPLIT_DRAFTER_MAX_CONTEXT=.*/BITSPLIT_DRAFTER_MAX_CONTEXT=4096/' \
  "$ROOT/deploy/bitsplit.env" >"$env_file"
start_args=(--env "$env_file")
[[ $# -ge 3 ]] && start_args+=(--model "$3")
"$ROOT/scripts/start-services.sh" start "${start_args[@]}" >&2
trap '"$ROOT/scripts/start-services.sh" stop >&2' EXIT
python3 "$ROOT/bench/prefix_cache_turns.py" "$BITSPLIT_HTTP" "$TURNS" "$ANSWER_TOKENS"
