#!/usr/bin/env bash
# scripts/start-services.sh status reports where each running service listens as the service
# itself printed it, not what the settings file says now: start the coordinator on a port of
# its own, then ask for the status with the env file's default listen address in force. Also
# checks what the start says about loading the weights and locking the residual.
#   tests/start_services_status_test.sh SOURCE_DIR BUILD_DIR SPLIT_PREFIX
set -uo pipefail
SOURCE=$1 BUILD=$2 PREFIX=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
TMP=$(mktemp -d)
export BITSPLIT_RUN_DIR=$TMP/run BITSPLIT_BUILD_DIR=$BUILD BITSPLIT_START_TIMEOUT_S=120
cleanup() { "$SOURCE/scripts/start-services.sh" stop >/dev/null 2>&1; rm -rf "$TMP"; }
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BITSPLIT_LISTEN=127.0.0.1:$port BITSPLIT_HTTP=127.0.0.1:0 \
  "$SOURCE/scripts/start-services.sh" start --model "$PREFIX" \
  >"$TMP/start.log" 2>&1 || { cat "$TMP/start.log"; fail "start-services.sh start failed"; }
# The start relays the services' progress while they fault their weights in, and (the env file
# asks for --mlock) either locks the residual, as root, or says it cannot.
grep -q "^  bitsplit-residual: loading .*100% (" "$TMP/start.log" ||
  { cat "$TMP/start.log"; fail "start did not relay the residual's loading progress"; }
grep -q "^  bitsplit-drafter: loading .*100% (" "$TMP/start.log" ||
  { cat "$TMP/start.log"; fail "start did not relay the drafter's loading progress"; }
if grep -q "raised RLIMIT_MEMLOCK to unlimited for --mlock" "$TMP/start.log"; then
  grep -q "mlocked" "$BITSPLIT_RUN_DIR/residual.log" ||
    { cat "$BITSPLIT_RUN_DIR/residual.log"; fail "the limit was raised, but the residual is not mlocked"; }
elif [[ $(ulimit -l) != unlimited ]]; then
  grep -q "dropping --mlock" "$TMP/start.log" || fail "start neither locked nor said it dropped --mlock"
  grep -q "is not locked in RAM (no --mlock)" "$BITSPLIT_RUN_DIR/residual.log" ||
    { cat "$BITSPLIT_RUN_DIR/residual.log"; fail "the residual did not say it is not locked"; }
fi
status=$("$SOURCE/scripts/start-services.sh" status 2>&1) || { echo "$status"; fail "status exited non-zero"; }
echo "$status"
grep -q "^bitsplit-coordinator .*running .*127.0.0.1:$port http://127.0.0.1:[1-9][0-9]*\$" \
  <<<"$status" || fail "status does not name the coordinator's port $port and its HTTP address"
http=$(grep -o "http://127.0.0.1:[0-9]*" <<<"$status")
curl -sf "$http/health" | grep -q '"ok"' || fail "the HTTP API at $http does not answer /health"
grep -q "50051" <<<"$status" && fail "status names the env file's port, not the running one"
grep -q "^bitsplit-drafter .*running .*unix:$BITSPLIT_RUN_DIR/drafter.sock\$" <<<"$status" ||
  fail "status does not name the drafter's socket"
"$SOURCE/scripts/start-services.sh" stop >/dev/null 2>&1 || fail "stop failed"
"$SOURCE/scripts/start-services.sh" status >/dev/null 2>&1 && fail "status is 0 with nothing running"
echo "PASS"
