#!/usr/bin/env bash
# A Python environment of pinned, hash-checked wheels from PyPI, made once per requirements file
# in the per-user cache and reused; nothing is fetched once it exists. Prints the python path.
#
#   scripts/venv.sh NAME REQUIREMENTS MODULE...
#
# NAME names the cache directory (NAME-venv-<hash of REQUIREMENTS>); each MODULE is imported once
# after installation to prove the environment works.
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: scripts/venv.sh NAME REQUIREMENTS MODULE..." >&2
  exit 2
fi
NAME="$1"
REQUIREMENTS="$2"
shift 2
CACHE="${BITSPLIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bitsplit}"
VENV="$CACHE/$NAME-venv-$(sha256sum "$REQUIREMENTS" | cut -c1-12)"
if [[ ! -f "$VENV/.complete" ]]; then
  echo "venv: installing $REQUIREMENTS into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check --only-binary=:all: --require-hashes \
    -r "$REQUIREMENTS" >&2
  imports=$(IFS=,; echo "$*")
  "$VENV/bin/python" -c "import $imports" >&2
  touch "$VENV/.complete"
fi
echo "$VENV/bin/python"
