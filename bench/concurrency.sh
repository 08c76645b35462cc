#!/usr/bin/env bash
# Concurrent streams through the three real processes, batched vs serialized, side by side in
# one run (docs/performance.md, "Continuous batching"): the services start twice
# (scripts/start-services.sh, the deploy/bitsplit.env settings with --max-active 8 and 8 drafter
# sessions), once as they ship (the drafter's scheduler batches every active request into each
# forward) and once with --max-batch-generations 1 (one request's step per forward, in turn),
# and build/bench/concurrency_bench runs 1, 2, 4 and 8 concurrent greedy streams of TOKENS
# tokens for `off` and a 16-node tree. Last, the one-stream comparison: the in-process verify
# decode rate of `bitsplit generate` (the same base + residual arithmetic in one process) beside
# one stream through the services with speculation off.
#   bench/concurrency.sh [TOKENS=64] [STREAMS=1,2,4,8]
# The services must not be running already (the script starts and stops its own, in
# $BITSPLIT_RUN_DIR, default /tmp/bitsplit-concurrency).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_BUILD_DIR:-$ROOT/build}"
TOKENS=${1:-64}
STREAMS=${2:-1,2,4,8}
export BITSPLIT_RUN_DIR="${BITSPLIT_RUN_DIR:-/tmp/bitsplit-concurrency}"
export BITSPLIT_LISTEN="${BITSPLIT_LISTEN:-localhost:50171}"
CACHE="${BITSPLIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bitsplit}"
ENV_FILE=$(mktemp)
trap '"$ROOT/scripts/start-services.sh" stop >/dev/null 2>&1 || true; rm -f "$ENV_FILE"' EXIT

echo "| drafter | speculation | streams | aggregate tok/s | per-token ms p50 | p99 |" \
  "generations/iteration | residual MB/token | residual round trips/token |"
echo "|---|---|---|---|---|---|---|---|---|"
for config in batched serialized; do
  flags=""
  [[ $config == serialized ]] && flags="--max-batch-generations 1"
  sed -e 's/^BITSPLIT_MAX_ACTIVE=.*/BITSPLIT_MAX_ACTIVE=8/' \
    -e 's/^BITSPLIT_DRAFTER_MAX_SESSIONS=.*/BITSPLIT_DRAFTER_MAX_SESSIONS=8/' \
    -e "s/^BITSPLIT_DRAFTER_FLAGS=.*/BITSPLIT_DRAFTER_FLAGS=\"$flags\"/" \
    "$ROOT/deploy/bitsplit.env" >"$ENV_FILE"
  "$ROOT/scripts/start-services.sh" start --env "$ENV_FILE" --model smollm2 >/dev/null 2>&1
  for speculation in off tree; do
    "$BUILD/bench/concurrency_bench" --server "$BITSPLIT_LISTEN" \
      --drafter "unix:$BITSPLIT_RUN_DIR/drafter.sock" --streams "$STREAMS" --tokens "$TOKENS" \
      --speculation "$speculation" --label "$config"
  done
  if [[ $config == batched ]]; then
    one_stream=$("$BUILD/tools/bitsplit/bitsplit" generate --server "$BITSPLIT_LISTEN" \
      --prompt "Once upon a time" -n "$TOKENS" --speculation off 2>&1 >/dev/null | tail -n 1)
  fi
  "$ROOT/scripts/start-services.sh" stop >/dev/null 2>&1
done
in_process=$("$BUILD/tools/bitsplit/bitsplit" generate --model "$CACHE/split/smollm2.base.bsplit" \
  --residual "$CACHE/split/smollm2.residual.bsplit" --prompt "Once upon a time" -n "$TOKENS" \
  2>&1 >/dev/null | tail -n 1)
echo
echo "one stream, speculation off, through the services: $one_stream"
echo "in process (bitsplit generate, verify mode):       $in_process"
