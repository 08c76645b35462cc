#!/usr/bin/env bash
# The main job: install what is missing, fetch and verify the model, build, start the three
# services (cpu-residual, drafter, coordinator; scripts/start-services.sh quantizes the split
# model once), stream a chat answer through the coordinator, ending with the speculation stats
# (verify steps, tokens per verify, acceptance by depth, tokens/s), then stop the services.
#
#   scripts/run.sh ["your question"] [--keep] [extra `bitsplit chat` flags, e.g. -n 64 --speculation off]
#
# --keep leaves the services running (stop them with scripts/start-services.sh stop); services
# that were already running are reused and left running.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_BUILD_DIR:-$ROOT/build}"

QUESTION="Explain in three sentences why the sky is blue."
if [[ $# -gt 0 && $1 != -* ]]; then QUESTION=$1; shift; fi
KEEP=false
CHAT_FLAGS=()
for arg in "$@"; do
  if [[ $arg == --keep ]]; then KEEP=true; else CHAT_FLAGS+=("$arg"); fi
done

if [[ $(id -u) -eq 0 ]] || command -v sudo >/dev/null; then
  "$ROOT/scripts/setup.sh"
else
  "$ROOT/scripts/setup.sh" --models
fi
echo "run: building (first time: a few minutes)" >&2
"$ROOT/scripts/build.sh" >/dev/null

if "$ROOT/scripts/start-services.sh" status >/dev/null 2>&1; then
  echo "run: reusing the running services" >&2
  KEEP=true
else
  if [[ $KEEP == false ]]; then
    trap '"$ROOT/scripts/start-services.sh" stop' EXIT
  fi
  "$ROOT/scripts/start-services.sh" start
fi

# shellcheck source=../deploy/bitsplit.env
LISTEN="${BITSPLIT_LISTEN:-$(set -a; source "$ROOT/deploy/bitsplit.env"; echo "$BITSPLIT_LISTEN")}"
"$BUILD/tools/bitsplit/bitsplit" chat --server "$LISTEN" -n 200 "${CHAT_FLAGS[@]}" "$QUESTION"
if [[ $KEEP == true ]]; then
  echo "run: services left running (scripts/start-services.sh status | stop)" >&2
fi
