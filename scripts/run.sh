#!/usr/bin/env bash
# The main job: install what is missing, fetch and verify the model, build, start the three
# services (cpu-residual, drafter, coordinator; scripts/start-services.sh quantizes the split
# model once), stream a chat answer through the coordinator, ending with the speculation stats
# (verify steps, tokens per verify, acceptance by depth, tokens/s), then stop the services.
#
#   scripts/run.sh ["your question"] [--model smollm2|gemma3] [--keep] [extra `bitsplit chat` flags,
#                  e.g. -n 64 --speculation off]
#
# --model picks a bundled model: smollm2 (the instruction-tuned SmolLM2-135M; the default unless
# deploy/bitsplit.env names an existing split model) or gemma3 (the pretrained gemma-3-270m, which
# continues text rather than following instructions).
# --keep leaves the services running (stop them with scripts/start-services.sh stop); services
# that were already running are reused and left running.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_BUILD_DIR:-$ROOT/build}"

QUESTION="Explain in three sentences why the sky is blue."
if [[ $# -gt 0 && $1 != -* ]]; then QUESTION=$1; shift; fi
KEEP=false
MODEL=""
CHAT_FLAGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --keep) KEEP=true; shift ;;
    --model)
      MODEL=${2:?--model needs smollm2 or gemma3}; shift 2
      [[ $MODEL == smollm2 || $MODEL == gemma3 ]] || { echo "run: --model is smollm2 or gemma3" >&2; exit 2; } ;;
    *) CHAT_FLAGS+=("$1"); shift ;;
  esac
done

if [[ $(id -u) -eq 0 ]] || command -v sudo >/dev/null; then
  "$ROOT/scripts/setup.sh"
else
  "$ROOT/scripts/setup.sh" --models
fi
# Its progress goes to stderr with the rest of what this script says: stdout is the answer.
"$ROOT/scripts/build.sh" >&2

if "$ROOT/scripts/start-services.sh" status >/dev/null 2>&1; then
  echo "run: reusing the running services" >&2
  KEEP=true
else
  if [[ $KEEP == false ]]; then
    trap '"$ROOT/scripts/start-services.sh" stop' EXIT
  fi
  "$ROOT/scripts/start-services.sh" start ${MODEL:+--model "$MODEL"}
fi

# shellcheck source=../deploy/bitsplit.env
LISTEN="${BITSPLIT_LISTEN:-$(set -a; source "$ROOT/deploy/bitsplit.env"; echo "$BITSPLIT_LISTEN")}"
"$BUILD/tools/bitsplit/bitsplit" chat --server "$LISTEN" -n 200 "${CHAT_FLAGS[@]}" "$QUESTION"
if [[ $KEEP == true ]]; then
  echo "run: services left running (scripts/start-services.sh status | stop):" >&2
  "$ROOT/scripts/start-services.sh" status >&2 || true
fi
