#!/usr/bin/env bash
# Installs the bitsplit services for systemd: binaries, the readiness helper, the units, the
# settings file, the sysusers.d entry (user and group `bitsplit`) and the model directory.
# Idempotent: unchanged files are left alone, an edited /etc/bitsplit/bitsplit.env is kept (the
# shipped version goes next to it as bitsplit.env.new).
#
#   sudo deploy/install.sh [--prefix /usr/local] [--build-dir build] [--model PREFIX] [--enable]
#   deploy/install.sh --destdir /tmp/stage ...     stage into a directory (no root, no systemctl)
#
#   --prefix DIR     binaries in DIR/bin, the helper in DIR/libexec/bitsplit (default /usr/local)
#   --build-dir DIR  where scripts/build.sh put the binaries (default: build/ of this checkout)
#   --model PREFIX   copy PREFIX.base.bsplit and PREFIX.residual.bsplit into
#                    /var/lib/bitsplit/models/ and point the settings file at them
#   --enable         systemctl enable bitsplit.target (start at boot)
#   --destdir DIR    prepend DIR to every installed path; skips users, ownership and systemctl
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PREFIX=/usr/local
BUILD="$ROOT/build"
DESTDIR=""
MODEL=""
ENABLE=false

die() { echo "install: error: $*" >&2; exit 1; }
say() { echo "install: $*" >&2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix) PREFIX=${2:?--prefix needs a directory}; shift 2 ;;
    --build-dir) BUILD=${2:?--build-dir needs a directory}; shift 2 ;;
    --destdir) DESTDIR=${2:?--destdir needs a directory}; shift 2 ;;
    --model) MODEL=${2:?--model needs a prefix}; shift 2 ;;
    --enable) ENABLE=true; shift ;;
    -h | --help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $PREFIX == /* ]] || die "--prefix must be an absolute path, got '$PREFIX'"
[[ -z $DESTDIR || $DESTDIR == /* ]] || DESTDIR="$(pwd)/$DESTDIR"
if [[ -z $DESTDIR && $(id -u) -ne 0 ]]; then
  die "installing into the system needs root (sudo $0 ...), or stage with --destdir DIR"
fi

UNIT_DIR=/etc/systemd/system
CONF_DIR=/etc/bitsplit
SYSUSERS_DIR=/etc/sysusers.d
MODEL_DIR=/var/lib/bitsplit/models
DOC_DIR="$PREFIX/share/doc/bitsplit/deploy"

declare -A BINARIES=(
  [bitsplit-residual]="$BUILD/services/cpu-residual/bitsplit-residual"
  [bitsplit-drafter]="$BUILD/services/gpu-drafter/bitsplit-drafter"
  [bitsplit-coordinator]="$BUILD/services/coordinator/bitsplit-coordinator"
  [bitsplit]="$BUILD/tools/bitsplit/bitsplit"
)
for name in "${!BINARIES[@]}"; do
  [[ -x ${BINARIES[$name]} ]] || die "${BINARIES[$name]} is missing (run scripts/build.sh, or pass --build-dir)"
done
if [[ -n $MODEL ]]; then
  for part in base residual; do
    [[ -f $MODEL.$part.bsplit ]] || die "--model $MODEL: $MODEL.$part.bsplit is missing"
  done
fi

# put SOURCE TARGET MODE: installs unless TARGET already has the same content and mode.
put() {
  local source=$1 target="$DESTDIR$2" mode=$3
  if [[ -f $target ]] && cmp -s "$source" "$target" &&
     [[ $(stat -c %a "$target") == "${mode#0}" ]]; then
    say "unchanged $2"
    return
  fi
  install -D -m "$mode" "$source" "$target"
  say "installed $2"
}

# The units name /usr/local; another prefix is substituted in the lines that point into it.
staged_unit() {
  local unit=$1 out=$2
  sed -e "/^\(Exec\|Documentation\)/s#/usr/local/#$PREFIX/#g" "$HERE/$unit" >"$out"
}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

for name in "${!BINARIES[@]}"; do put "${BINARIES[$name]}" "$PREFIX/bin/$name" 0755; done
put "$HERE/wait-for-endpoint" "$PREFIX/libexec/bitsplit/wait-for-endpoint" 0755
for unit in bitsplit-residual.service bitsplit-drafter.service bitsplit-coordinator.service \
            bitsplit.target; do
  staged_unit "$unit" "$TMP/$unit"
  put "$TMP/$unit" "$UNIT_DIR/$unit" 0644
done
put "$HERE/sysusers.d/bitsplit.conf" "$SYSUSERS_DIR/bitsplit.conf" 0644
put "$HERE/README.md" "$DOC_DIR/README.md" 0644

# The settings file: never overwrite the administrator's edits.
env_target="$DESTDIR$CONF_DIR/bitsplit.env"
if [[ ! -f $env_target ]]; then
  put "$HERE/bitsplit.env" "$CONF_DIR/bitsplit.env" 0640
elif cmp -s "$HERE/bitsplit.env" "$env_target"; then
  say "unchanged $CONF_DIR/bitsplit.env"
else
  put "$HERE/bitsplit.env" "$CONF_DIR/bitsplit.env.new" 0640
  say "kept your $CONF_DIR/bitsplit.env; the shipped version is $CONF_DIR/bitsplit.env.new"
fi

mkdir -p "$DESTDIR$MODEL_DIR"
chmod 0750 "$DESTDIR$MODEL_DIR" "$(dirname "$DESTDIR$MODEL_DIR")"
if [[ -n $MODEL ]]; then
  name=$(basename "$MODEL")
  for part in base residual; do put "$MODEL.$part.bsplit" "$MODEL_DIR/$name.$part.bsplit" 0640; done
  sed -i -e "s#^BITSPLIT_BASE_MODEL=.*#BITSPLIT_BASE_MODEL=$MODEL_DIR/$name.base.bsplit#" \
         -e "s#^BITSPLIT_RESIDUAL_MODEL=.*#BITSPLIT_RESIDUAL_MODEL=$MODEL_DIR/$name.residual.bsplit#" \
         "$env_target"
  say "settings: BITSPLIT_{BASE,RESIDUAL}_MODEL -> $MODEL_DIR/$name.{base,residual}.bsplit"
fi

if [[ -n $DESTDIR ]]; then
  say "staged under $DESTDIR (no users, ownership or systemctl)"
  exit 0
fi

systemd-sysusers "$SYSUSERS_DIR/bitsplit.conf"
# The services read the settings and the models as group bitsplit; nothing else may.
chown root:bitsplit "$CONF_DIR" "$CONF_DIR/bitsplit.env" "$MODEL_DIR" "$(dirname "$MODEL_DIR")"
chmod 0750 "$CONF_DIR"
find "$MODEL_DIR" -maxdepth 1 -name '*.bsplit' -exec chown root:bitsplit {} + -exec chmod 0640 {} +
if [[ -d /run/systemd/system ]]; then
  systemctl daemon-reload
  if [[ $ENABLE == true ]]; then systemctl enable bitsplit.target; fi
  say "done: sudo systemctl start bitsplit.target; systemctl status bitsplit.target"
else
  say "systemd is not running here: units installed but not loaded (scripts/start-services.sh runs the services without it)"
fi
