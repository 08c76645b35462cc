#!/usr/bin/env bash
# The Python environment of the HTTP API's client tests (tests/http/requirements.txt: the
# official openai client and prometheus_client, pinned with hashes), made once per requirements
# file in the per-user cache and reused. Prints the python path.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${BITSPLIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bitsplit}"
REQUIREMENTS="$ROOT/tests/http/requirements.txt"
VENV="$CACHE/test-venv-$(sha256sum "$REQUIREMENTS" | cut -c1-12)"
if [[ ! -f "$VENV/.complete" ]]; then
  echo "test-venv: installing the pinned test clients into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check --only-binary=:all: --require-hashes \
    -r "$REQUIREMENTS" >&2
  "$VENV/bin/python" -c "import openai, prometheus_client" >&2
  touch "$VENV/.complete"
fi
echo "$VENV/bin/python"
