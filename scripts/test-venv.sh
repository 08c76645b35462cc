#!/usr/bin/env bash
# The Python environment of the HTTP API's client tests (tests/http/requirements.txt: the
# official openai client and prometheus_client, pinned with hashes). Prints the python path.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "$ROOT/scripts/venv.sh" test "$ROOT/tests/http/requirements.txt" openai prometheus_client
