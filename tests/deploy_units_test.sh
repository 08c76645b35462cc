#!/usr/bin/env bash
# Checks deploy/ (registered in tests/CMakeLists.txt, "deploy tests"):
#
#   deploy_units_test.sh verify SOURCE_DIR RESIDUAL_BIN DRAFTER_BIN COORDINATOR_BIN
#     `systemd-analyze verify` of the units with ExecStart pointed at the built binaries: any
#     message about them fails the test (unknown keys and bad values are only warnings with exit
#     status 0). Deliberately broken copies must be rejected too, so a blind check cannot pass.
#     Also: the variables the units use are all set in bitsplit.env, the units the units name
#     exist, the sysusers.d entry creates user and group bitsplit, the hardening stays at
#     `systemd-analyze security` exposure <= 2.0, and the deployment invariants of README.md.
#   deploy_units_test.sh install SOURCE_DIR RESIDUAL_BIN DRAFTER_BIN COORDINATOR_BIN CLI_BIN
#     deploy/install.sh --destdir: the layout, the prefix substitution, idempotency, and that an
#     edited settings file is kept.
set -uo pipefail

fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "deploy test: $*"; }

[[ $# -ge 5 ]] || fail "usage: $0 verify|install SOURCE_DIR RESIDUAL DRAFTER COORDINATOR [CLI]"
MODE=$1 SRC=$2 RESIDUAL_BIN=$3 DRAFTER_BIN=$4 COORDINATOR_BIN=$5 CLI_BIN=${6:-}
DEPLOY="$SRC/deploy"
SERVICES=(bitsplit-residual.service bitsplit-drafter.service bitsplit-coordinator.service)
UNITS=("${SERVICES[@]}" bitsplit.target)

for bin in "$RESIDUAL_BIN" "$DRAFTER_BIN" "$COORDINATOR_BIN" ${CLI_BIN:+"$CLI_BIN"}; do
  [[ -x $bin ]] || fail "$bin is not built (build the bitsplit-residual, bitsplit-drafter, bitsplit-coordinator and bitsplit targets first)"
done
for tool in systemd-analyze systemd-sysusers; do
  command -v "$tool" >/dev/null || fail "$tool not found (Debian package: systemd; scripts/setup.sh installs it)"
done

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# stage DIR: the units with the installed paths replaced by the built binaries.
stage() {
  local dir=$1 unit
  mkdir -p "$dir"
  for unit in "${UNITS[@]}"; do
    sed -e "s#/usr/local/bin/bitsplit-residual#$RESIDUAL_BIN#g" \
        -e "s#/usr/local/bin/bitsplit-drafter#$DRAFTER_BIN#g" \
        -e "s#/usr/local/bin/bitsplit-coordinator#$COORDINATOR_BIN#g" \
        -e "s#/usr/local/libexec/bitsplit/wait-for-endpoint#$DEPLOY/wait-for-endpoint#g" \
        -e "s#/etc/bitsplit/bitsplit.env#$DEPLOY/bitsplit.env#g" \
        "$DEPLOY/$unit" >"$dir/$unit"
  done
}

# check_units DIR: 0 iff systemd-analyze accepts every unit in DIR without a message about it.
check_units() {
  local dir=$1 output status
  output=$(cd "$dir" && systemd-analyze verify --man=no "${UNITS[@]/#/./}" 2>&1)
  status=$?
  # Only messages about our units count (the host's own units are not under test).
  local ours
  ours=$(grep -E "bitsplit|$dir" <<<"$output")
  if [[ $status -ne 0 || -n $ours ]]; then
    echo "$output"
    return 1
  fi
  return 0
}

verify_mode() {
  stage "$TMP/units"
  if ! check_units "$TMP/units"; then fail "systemd-analyze verify rejected deploy/ units"; fi
  note "systemd-analyze verify: ${#UNITS[@]} units clean"

  # The check must catch each of these breakages (else it could pass on anything).
  local -a breakages=(
    "bitsplit-residual.service|/^\[Service\]/a Frobnicate=yes|unknown key"
    "bitsplit-drafter.service|s/^Restart=on-failure/Restart=sometimes/|bad value"
    "bitsplit-coordinator.service|s#^ExecStart=[^ ]*#ExecStart=/nonexistent/bitsplit-coordinator#|missing binary"
    "bitsplit-residual.service|/^ExecStart=/,/FLAGS\$/d|no ExecStart"
    "bitsplit.target|s/^Wants=/Wnats=/|misspelt key in the target"
    "bitsplit-drafter.service|s/^RuntimeDirectoryMode=0770/RuntimeDirectoryMode=rwx/|bad mode"
  )
  local entry unit edit what
  for entry in "${breakages[@]}"; do
    IFS='|' read -r unit edit what <<<"$entry"
    rm -rf "$TMP/broken"
    stage "$TMP/broken"
    sed -i -e "$edit" "$TMP/broken/$unit"
    cmp -s "$TMP/broken/$unit" "$TMP/units/$unit" && fail "breakage '$what' did not change $unit"
    if check_units "$TMP/broken" >/dev/null; then
      fail "systemd-analyze verify accepted a broken $unit ($what)"
    fi
    note "rejected as expected: $unit with $what"
  done

  # Every variable the units expand is set in bitsplit.env (an unset one expands to nothing and
  # shifts the arguments), and bash can source the file (scripts/start-services.sh does).
  local var missing=()
  for var in $(grep -ohE '\$\{?BITSPLIT_[A-Z_]+' "${SERVICES[@]/#/$DEPLOY/}" | tr -d '${' | sort -u); do
    grep -qE "^$var=" "$DEPLOY/bitsplit.env" || missing+=("$var")
  done
  ((${#missing[@]} == 0)) || fail "used by the units but not set in bitsplit.env: ${missing[*]}"
  (set -eu; set -a; source "$DEPLOY/bitsplit.env"; [[ -n $BITSPLIT_LISTEN ]]) ||
    fail "bash cannot source deploy/bitsplit.env"
  note "bitsplit.env sets every variable the units use"

  # Units named by the units exist.
  local name
  for name in $(grep -ohE 'bitsplit[a-z-]*\.(service|target)' "${UNITS[@]/#/$DEPLOY/}" | sort -u); do
    [[ -f $DEPLOY/$name ]] || fail "a unit refers to $name, which deploy/ does not have"
  done

  # sysusers.d: creates the user and group in a scratch root.
  mkdir -p "$TMP/root/etc"
  systemd-sysusers --root="$TMP/root" "$DEPLOY/sysusers.d/bitsplit.conf" >/dev/null 2>&1 ||
    fail "systemd-sysusers rejected deploy/sysusers.d/bitsplit.conf"
  grep -q '^bitsplit:x:[0-9]*:[0-9]*:.*:/usr/sbin/nologin$' "$TMP/root/etc/passwd" ||
    fail "sysusers did not create user bitsplit"
  grep -q '^bitsplit:x:' "$TMP/root/etc/group" || fail "sysusers did not create group bitsplit"
  note "sysusers.d creates user and group bitsplit"

  # Hardening does not regress.
  local service level
  for service in "${SERVICES[@]}"; do
    level=$(cd "$TMP/units" && systemd-analyze security --offline=yes --no-pager "./$service" 2>&1 |
            sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
    [[ -n $level ]] || fail "systemd-analyze security gave no exposure level for $service"
    awk -v l="$level" 'BEGIN { exit !(l <= 2.0) }' || fail "$service exposure $level > 2.0"
    note "$service exposure level $level"
  done

  # Deployment invariants (README.md explains each).
  for service in "${SERVICES[@]}"; do
    local file="$DEPLOY/$service"
    grep -qx 'RuntimeDirectory=bitsplit' "$file" || fail "$service: RuntimeDirectory=bitsplit"
    grep -qx 'RuntimeDirectoryPreserve=yes' "$file" ||
      fail "$service: without RuntimeDirectoryPreserve=yes stopping it deletes the others' sockets"
    grep -qx 'RemoveIPC=no' "$file" || fail "$service: RemoveIPC=no keeps the shared-memory segments"
    grep -qE '^(DynamicUser=yes|PrivateIPC=yes|Requires=|BindsTo=)' "$file" &&
      fail "$service: DynamicUser/PrivateIPC/Requires/BindsTo break the shared segments or restarts"
    { grep -qx 'User=bitsplit' "$file" && grep -qx 'Group=bitsplit' "$file"; } ||
      fail "$service: must run as bitsplit:bitsplit"
  done
  grep -qx 'LimitMEMLOCK=infinity' "$DEPLOY/bitsplit-residual.service" ||
    fail "bitsplit-residual.service: --mlock needs LimitMEMLOCK=infinity"
  grep -qE '^(PrivateDevices=yes|MemoryDenyWriteExecute=yes)' "$DEPLOY/bitsplit-drafter.service" &&
    fail "bitsplit-drafter.service: the CUDA backend needs /dev/nvidia* and executable mappings"
  grep -qx 'After=bitsplit-residual.service' "$DEPLOY/bitsplit-drafter.service" ||
    fail "the drafter must start after the residual service"
  grep -qE '^After=bitsplit-drafter.service' "$DEPLOY/bitsplit-coordinator.service" ||
    fail "the coordinator must start after the drafter"
  note "deployment invariants hold"
}

install_mode() {
  [[ -n $CLI_BIN ]] || fail "install mode needs CLI_BIN"
  local build="$TMP/build" stage="$TMP/stage" prefix=/opt/bitsplit-test
  mkdir -p "$build/services/cpu-residual" "$build/services/gpu-drafter" \
           "$build/services/coordinator" "$build/tools/bitsplit"
  ln -s "$RESIDUAL_BIN" "$build/services/cpu-residual/bitsplit-residual"
  ln -s "$DRAFTER_BIN" "$build/services/gpu-drafter/bitsplit-drafter"
  ln -s "$COORDINATOR_BIN" "$build/services/coordinator/bitsplit-coordinator"
  ln -s "$CLI_BIN" "$build/tools/bitsplit/bitsplit"
  local install=("$DEPLOY/install.sh" --destdir "$stage" --build-dir "$build" --prefix "$prefix")

  "${install[@]}" >"$TMP/first.log" 2>&1 || { cat "$TMP/first.log"; fail "install.sh failed"; }
  local path
  for path in "$prefix/bin/bitsplit-residual" "$prefix/bin/bitsplit-drafter" \
              "$prefix/bin/bitsplit-coordinator" "$prefix/bin/bitsplit" \
              "$prefix/libexec/bitsplit/wait-for-endpoint"; do
    [[ -x $stage$path ]] || fail "install.sh did not install $path"
  done
  cmp -s "$stage$prefix/bin/bitsplit-residual" "$RESIDUAL_BIN" || fail "installed residual differs"
  for path in "${UNITS[@]/#//etc/systemd/system/}" /etc/sysusers.d/bitsplit.conf \
              /etc/bitsplit/bitsplit.env; do
    [[ -f $stage$path ]] || fail "install.sh did not install $path"
  done
  [[ -d $stage/var/lib/bitsplit/models ]] || fail "install.sh did not create the model directory"
  [[ $(stat -c %a "$stage/etc/bitsplit/bitsplit.env") == 640 ]] || fail "bitsplit.env must be 0640"
  grep -q "^ExecStart=$prefix/bin/bitsplit-drafter " "$stage/etc/systemd/system/bitsplit-drafter.service" ||
    fail "the prefix was not substituted into ExecStart"
  grep -q "^ExecStartPost=$prefix/libexec/bitsplit/wait-for-endpoint " \
    "$stage/etc/systemd/system/bitsplit-residual.service" || fail "the prefix was not substituted into ExecStartPost"
  grep -rq /usr/local "$stage/etc/systemd/system" && fail "a unit still names /usr/local"

  # Idempotent: a second run changes nothing.
  "${install[@]}" >"$TMP/second.log" 2>&1 || { cat "$TMP/second.log"; fail "second install.sh run failed"; }
  grep -q '^install: installed' "$TMP/second.log" && { cat "$TMP/second.log"; fail "second run reinstalled files"; }

  # The administrator's settings survive an update.
  echo 'BITSPLIT_MAX_ACTIVE=2' >>"$stage/etc/bitsplit/bitsplit.env"
  "${install[@]}" >"$TMP/third.log" 2>&1 || fail "third install.sh run failed"
  grep -qx 'BITSPLIT_MAX_ACTIVE=2' "$stage/etc/bitsplit/bitsplit.env" || fail "install.sh overwrote edited settings"
  cmp -s "$DEPLOY/bitsplit.env" "$stage/etc/bitsplit/bitsplit.env.new" || fail "no bitsplit.env.new beside edited settings"

  # Bad arguments fail with a message.
  "$DEPLOY/install.sh" --destdir "$stage" --build-dir "$TMP/nowhere" >/dev/null 2>&1 &&
    fail "install.sh accepted a build directory without binaries"
  "$DEPLOY/install.sh" --destdir "$stage" --build-dir "$build" --prefix relative >/dev/null 2>&1 &&
    fail "install.sh accepted a relative prefix"
  "$DEPLOY/install.sh" --destdir "$stage" --build-dir "$build" --model "$TMP/none" >/dev/null 2>&1 &&
    fail "install.sh accepted a missing model"
  note "install.sh: layout, prefix, idempotency, kept settings, bad arguments"
}

case "$MODE" in
  verify) verify_mode ;;
  install) install_mode ;;
  *) fail "unknown mode '$MODE'" ;;
esac
echo "PASS"
