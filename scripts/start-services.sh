#!/usr/bin/env bash
# Runs the three bitsplit services without systemd, with the flags of the systemd units
# (deploy/*.service) and the settings of deploy/bitsplit.env, as the current user:
#
#   scripts/start-services.sh [start] [--env FILE] [--model NAME|PREFIX]   start (or reuse) all three
#   scripts/start-services.sh stop                                     SIGTERM, SIGKILL after a grace
#   scripts/start-services.sh status                                   exit 0 iff all three run
#
# Sockets, logs and pid files live in $BITSPLIT_RUN_DIR (default ${XDG_RUNTIME_DIR:-/tmp}/bitsplit-$UID)
# instead of /run/bitsplit. The model: --model smollm2 or gemma3 (a bundled model, quantized from
# models/ into ~/.cache/bitsplit/split/ with the default knobs the first time), --model PREFIX
# (PREFIX.{base,residual}.bsplit), else the env file's BITSPLIT_BASE_MODEL/BITSPLIT_RESIDUAL_MODEL
# when both exist, else smollm2.
# Environment: BITSPLIT_BUILD_DIR (default build/), BITSPLIT_LISTEN and BITSPLIT_HTTP (override
# the env file; BITSPLIT_HTTP="" turns the HTTP API off),
# BITSPLIT_START_TIMEOUT_S (per service, default 300), BITSPLIT_STOP_GRACE_S (default 10).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_BUILD_DIR:-$ROOT/build}"
RUN_DIR="${BITSPLIT_RUN_DIR:-${XDG_RUNTIME_DIR:-/tmp}/bitsplit-$(id -u)}"
CACHE="${BITSPLIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bitsplit}"
START_TIMEOUT_S="${BITSPLIT_START_TIMEOUT_S:-300}"
STOP_GRACE_S="${BITSPLIT_STOP_GRACE_S:-10}"
SERVICES=(residual drafter coordinator)  # start order; stop is the reverse

say() { echo "start-services: $*" >&2; }
die() { echo "start-services: error: $*" >&2; exit 1; }

binary_of() {
  case "$1" in
    residual) echo "$BUILD/services/cpu-residual/bitsplit-residual" ;;
    drafter) echo "$BUILD/services/gpu-drafter/bitsplit-drafter" ;;
    coordinator) echo "$BUILD/services/coordinator/bitsplit-coordinator" ;;
  esac
}
pid_file() { echo "$RUN_DIR/$1.pid"; }
log_file() { echo "$RUN_DIR/$1.log"; }

# The pid of a running service, or nothing: the pid file must name a live process that runs
# that service's binary (a stale file's pid may have been reused by something else).
running_pid() {
  local file pid argv0
  file=$(pid_file "$1")
  [[ -f $file ]] || return 0
  pid=$(<"$file")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  argv0=$({ tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null | head -n 1) || return 0
  [[ $(basename "$argv0") == "bitsplit-$1" ]] && echo "$pid"
  return 0
}

endpoint_of() {
  case "$1" in
    residual) echo "unix:$RUN_DIR/residual.sock" ;;
    drafter) echo "unix:$RUN_DIR/drafter.sock" ;;
    coordinator) echo "$BITSPLIT_LISTEN" ;;
  esac
}

endpoint_up() {
  case "$1" in
    residual | drafter) [[ -S $RUN_DIR/$1.sock ]] ;;
    coordinator)
      # A unix socket ("unix:/path") or a TCP HOST:PORT.
      if [[ $BITSPLIT_LISTEN == unix:* ]]; then
        [[ -S ${BITSPLIT_LISTEN#unix:} ]]
        return
      fi
      local host=${BITSPLIT_LISTEN%:*} port=${BITSPLIT_LISTEN##*:}
      host=${host#[}; host=${host%]}
      (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null ;;
  esac
}

load_env() {
  local env_file=$1 listen_override=${BITSPLIT_LISTEN:-} http_set=${BITSPLIT_HTTP+set}
  local http_override=${BITSPLIT_HTTP:-}
  [[ -f $env_file ]] || die "settings file $env_file not found"
  set -a
  # shellcheck source=../deploy/bitsplit.env
  source "$env_file"
  set +a
  [[ -n $listen_override ]] && BITSPLIT_LISTEN=$listen_override
  [[ -n $http_set ]] && BITSPLIT_HTTP=$http_override  # set, even to "" (off), it wins
  return 0
}

# Sets BASE_MODEL and RESIDUAL_MODEL from --model: a bundled model's name (smollm2, gemma3), a
# split PREFIX, or nothing (the env file's model when both files exist, else smollm2).
resolve_model() {
  local prefix=$1
  if [[ -n $prefix && $prefix != smollm2 && $prefix != gemma3 ]]; then
    BASE_MODEL="$prefix.base.bsplit" RESIDUAL_MODEL="$prefix.residual.bsplit"
    [[ -f $BASE_MODEL && -f $RESIDUAL_MODEL ]] || die "--model $prefix: $BASE_MODEL or $RESIDUAL_MODEL is missing"
    return
  fi
  if [[ -z $prefix && -f ${BITSPLIT_BASE_MODEL:-} && -f ${BITSPLIT_RESIDUAL_MODEL:-} ]]; then
    BASE_MODEL=$BITSPLIT_BASE_MODEL RESIDUAL_MODEL=$BITSPLIT_RESIDUAL_MODEL
    return
  fi
  local name=${prefix:-smollm2} gguf
  case "$name" in
    smollm2) gguf="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
    gemma3) gguf="$ROOT/models/gemma-3-270m-q4_k_m.gguf" ;;
  esac
  local dir="$CACHE/split"
  BASE_MODEL="$dir/$name.base.bsplit" RESIDUAL_MODEL="$dir/$name.residual.bsplit"
  [[ -f $BASE_MODEL && -f $RESIDUAL_MODEL ]] && return
  local cli="$BUILD/tools/bitsplit/bitsplit"
  [[ -f $gguf ]] || die "$gguf is missing (run scripts/setup.sh --models)"
  [[ -x $cli ]] || die "$cli is missing (run scripts/build.sh)"
  say "quantizing $gguf once into $dir/$name.* (default knobs; one to two minutes)"
  mkdir -p "$dir"
  local tmp="$dir/$name.tmp.$$"
  if ! "$cli" quantize "$gguf" -o "$tmp" >"$dir/quantize.log" 2>&1; then
    rm -f "$tmp".*.bsplit
    tail -n 20 "$dir/quantize.log" >&2
    die "bitsplit quantize failed (log: $dir/quantize.log)"
  fi
  mv "$tmp.base.bsplit" "$BASE_MODEL"
  mv "$tmp.residual.bsplit" "$RESIDUAL_MODEL"
}

# Fills ARGS with the command line of a service: the same flags as its systemd unit.
command_of() {
  local residual_flags
  read -r -a residual_flags <<<"${BITSPLIT_RESIDUAL_FLAGS:-}"
  case "$1" in
    residual)
      if [[ " ${residual_flags[*]} " == *" --mlock "* && $(ulimit -l) != unlimited ]]; then
        # Root (with CAP_SYS_RESOURCE) may raise its own limit, as LimitMEMLOCK=infinity does in
        # the systemd unit.
        if ulimit -l unlimited 2>/dev/null; then
          say "raised RLIMIT_MEMLOCK to unlimited for --mlock"
        else
          say "note: dropping --mlock (RLIMIT_MEMLOCK is $(ulimit -l) KiB here and this shell cannot raise it: that takes root with CAP_SYS_RESOURCE; the systemd unit sets LimitMEMLOCK=infinity): the residual can be paged out"
          local kept=() flag
          for flag in "${residual_flags[@]}"; do [[ $flag == --mlock ]] || kept+=("$flag"); done
          residual_flags=("${kept[@]}")
        fi
      fi
      ARGS=("$RESIDUAL_MODEL" --socket "$RUN_DIR/residual.sock"
        --threads "$BITSPLIT_RESIDUAL_THREADS" --max-rows "$BITSPLIT_RESIDUAL_MAX_ROWS"
        --shutdown-grace-ms "$BITSPLIT_SHUTDOWN_GRACE_MS" "${residual_flags[@]}") ;;
    drafter)
      local extra; read -r -a extra <<<"${BITSPLIT_DRAFTER_FLAGS:-}"
      ARGS=("$BASE_MODEL" --residual-socket "unix:$RUN_DIR/residual.sock"
        --socket "$RUN_DIR/drafter.sock" --backend "$BITSPLIT_DRAFTER_BACKEND"
        --threads "$BITSPLIT_DRAFTER_THREADS" --max-sessions "$BITSPLIT_DRAFTER_MAX_SESSIONS"
        --max-context "$BITSPLIT_DRAFTER_MAX_CONTEXT"
        --max-tree-nodes "$BITSPLIT_DRAFTER_MAX_TREE_NODES"
        --residual-timeout-ms "$BITSPLIT_DRAFTER_RESIDUAL_TIMEOUT_MS"
        --shutdown-grace-ms "$BITSPLIT_SHUTDOWN_GRACE_MS" "${extra[@]}") ;;
    coordinator)
      local extra; read -r -a extra <<<"${BITSPLIT_COORDINATOR_FLAGS:-}"
      ARGS=(--model "$BASE_MODEL" --drafter "unix:$RUN_DIR/drafter.sock"
        --listen "$BITSPLIT_LISTEN" --max-active "$BITSPLIT_MAX_ACTIVE"
        --max-queue "$BITSPLIT_MAX_QUEUE" --speculation "$BITSPLIT_SPECULATION"
        --nodes "$BITSPLIT_NODES" --expansions "$BITSPLIT_EXPANSIONS"
        --max-depth "$BITSPLIT_MAX_DEPTH" --max-tokens-limit "$BITSPLIT_MAX_TOKENS_LIMIT"
        --http "${BITSPLIT_HTTP:-}"
        --shutdown-grace-ms "$BITSPLIT_SHUTDOWN_GRACE_MS" "${extra[@]}") ;;
  esac
}

# Ready = the "serving" line in the log and the endpoint up. Fails early when the process exits.
# Relays the service's "loading" progress lines (weights faulted into RAM) as they come.
wait_ready() {
  local service=$1 pid=$2 log deadline shown=0 lines
  log=$(log_file "$service")
  deadline=$((SECONDS + START_TIMEOUT_S))
  while true; do
    mapfile -t lines < <(grep "^bitsplit-$service: loading" "$log" 2>/dev/null || true)
    while ((shown < ${#lines[@]})); do echo "  ${lines[shown]}" >&2; shown=$((shown + 1)); done
    if grep -q "^bitsplit-$service: serving" "$log" 2>/dev/null && endpoint_up "$service"; then
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      local status=unknown
      wait "$pid" 2>/dev/null && status=0 || status=$?
      say "bitsplit-$service exited (status $status) before serving; last lines of $log:"
      tail -n 20 "$log" | sed 's/^/    /' >&2
      return 1
    fi
    if ((SECONDS >= deadline)); then
      say "bitsplit-$service (pid $pid) is not serving on $(endpoint_of "$service") after ${START_TIMEOUT_S}s; last lines of $log:"
      tail -n 20 "$log" | sed 's/^/    /' >&2
      return 1
    fi
    sleep 0.2
  done
}

stop_one() {
  local service=$1 pid waited=0
  pid=$(running_pid "$service")
  if [[ -z $pid ]]; then
    rm -f "$(pid_file "$service")"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null && ((waited < STOP_GRACE_S * 10)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "bitsplit-$service (pid $pid) ignored SIGTERM for ${STOP_GRACE_S}s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$(pid_file "$service")"
  say "stopped bitsplit-$service (pid $pid)"
}

stop_all() {
  local i
  for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do stop_one "${SERVICES[i]}"; done
}

start_all() {
  local env_file=$1 model_prefix=$2 service pid binary
  load_env "$env_file"
  mkdir -p "$RUN_DIR"
  chmod 0700 "$RUN_DIR"
  resolve_model "$model_prefix"
  for service in "${SERVICES[@]}"; do
    binary=$(binary_of "$service")
    [[ -x $binary ]] || die "$binary is missing (run scripts/build.sh)"
  done
  for service in "${SERVICES[@]}"; do
    pid=$(running_pid "$service")
    if [[ -n $pid ]]; then
      say "bitsplit-$service already running (pid $pid)"
    else
      command_of "$service"
      [[ $service == coordinator ]] || rm -f "$RUN_DIR/$service.sock"
      # setsid: the services outlive this script and a Ctrl-C in its terminal.
      setsid "$(binary_of "$service")" "${ARGS[@]}" </dev/null >"$(log_file "$service")" 2>&1 &
      pid=$!
      echo "$pid" >"$(pid_file "$service")"
    fi
    if ! wait_ready "$service" "$pid"; then
      stop_all
      die "bitsplit-$service did not start (logs in $RUN_DIR)"
    fi
    say "bitsplit-$service serving on $(served_endpoint "$service") (pid $pid, log $(log_file "$service"))"
  done
}

# Where a running service listens, from its own "serving ... on ADDRESS [(port N)]" log line
# (and the coordinator's "HTTP API on URL" line): what it bound, whatever the env file says now.
served_endpoint() {
  local line address port
  line=$(grep -a "^bitsplit-$1: serving " "$(log_file "$1")" 2>/dev/null | tail -n 1)
  [[ -n $line ]] || { echo "(no serving line in $(log_file "$1"))"; return; }
  address=${line##* on }
  if [[ $address == *" (port "* ]]; then
    port=${address##*(port }
    port=${port%)}
    address=${address%% *}
    address=${address%:*}:$port
  fi
  # The coordinator's HTTP API: "HTTP API on http://HOST:PORT (...)".
  line=$(grep -a "^bitsplit-$1: HTTP API on " "$(log_file "$1")" 2>/dev/null | tail -n 1)
  [[ -n $line ]] && { line=${line#*HTTP API on }; address="$address ${line%% *}"; }
  echo "$address"
}

status_all() {
  local service pid all=0
  for service in "${SERVICES[@]}"; do
    pid=$(running_pid "$service")
    if [[ -n $pid ]]; then
      printf 'bitsplit-%-12s running  pid %-8s %s\n' "$service" "$pid" "$(served_endpoint "$service")"
    else
      printf 'bitsplit-%-12s stopped\n' "$service"
      all=3
    fi
  done
  return $all
}

main() {
  local action=start env_file="$ROOT/deploy/bitsplit.env" model_prefix=""
  if [[ $# -gt 0 && $1 != --* ]]; then action=$1; shift; fi
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --env) env_file=${2:?--env needs a file}; shift 2 ;;
      --model) model_prefix=${2:?--model needs a prefix}; shift 2 ;;
      *) die "unknown argument '$1' (usage: start-services.sh [start|stop|status] [--env FILE] [--model NAME|PREFIX])" ;;
    esac
  done
  case "$action" in
    start) start_all "$env_file" "$model_prefix" ;;
    stop) stop_all ;;
    status) status_all ;;
    *) die "unknown action '$action' (start, stop or status)" ;;
  esac
}

main "$@"
