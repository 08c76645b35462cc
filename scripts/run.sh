#!/usr/bin/env bash
# The main job: install what is missing, fetch and verify the model, build, and stream a chat
# answer to the terminal, ending with the token counts and speed.
#   scripts/run.sh ["your question"] [extra `bitsplit generate` flags...]
# (The three-service speculative demo replaces the in-process engine when the services land.)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
QUESTION="${1:-Explain in three sentences why the sky is blue.}"
shift || true
if [[ $(id -u) -eq 0 ]] || command -v sudo >/dev/null; then
  "$ROOT/scripts/setup.sh"
else
  "$ROOT/scripts/setup.sh" --models
fi
echo "run: building (first time: a few minutes)" >&2
"$ROOT/scripts/build.sh" >/dev/null
exec "$ROOT/build/tools/bitsplit/bitsplit" generate \
  --model "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" --chat "$QUESTION" -n 200 "$@"
