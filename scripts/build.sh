#!/usr/bin/env bash
# Configures and builds into build/ (Release-with-debug-info, Ninja, ccache when present).
# Extra arguments go to CMake's configure step, e.g. -DBITSPLIT_CUDA=OFF.
#
# Without configure arguments, prints nothing when the build is up to date. Otherwise it says how
# many steps there are, then ninja shows its progress on stdout, each step as "[done/total
# percent elapsed] what": redrawn in place on a terminal, one line a step elsewhere (so logs get
# no carriage returns); last, the time it took.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_BUILD_DIR:-$ROOT/build}"
start=$SECONDS
first=false
[[ -f "$BUILD/build.ninja" ]] || first=true
if [[ $first == true || $# -gt 0 ]]; then
  echo "build: configuring $BUILD" >&2
  cmake -S "$ROOT" -B "$BUILD" -G Ninja "$@" >/dev/null
fi
cd "$BUILD"  # not ninja -C, which prints the directory it enters
plan=$(ninja -n)
if [[ $plan == "ninja: no work to do." ]]; then exit 0; fi
if grep -q 'Re-running CMake' <<<"$plan"; then
  # A dry run stops after the regeneration, so it cannot count the steps behind it.
  echo "build: CMake inputs changed; configuring again, then building $BUILD" >&2
else
  steps=$(grep -c '^\[' <<<"$plan" || true)
  hint=""
  [[ $first == true ]] && hint=" (a first build: 10-20 minutes on 2 cores, less with a warm ccache)"
  echo "build: $steps step(s) to run in $BUILD$hint" >&2
fi
NINJA_STATUS="${NINJA_STATUS:-[%f/%t %p %es] }" ninja -j"$(nproc)"
elapsed=$((SECONDS - start))
printf 'build: done in %dm%02ds\n' $((elapsed / 60)) $((elapsed % 60)) >&2
