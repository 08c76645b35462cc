#!/usr/bin/env bash
# scripts/build.sh on a build directory of three one-second-ish steps (a hand-written
# build.ninja, so that no CMake or compiler runs): into a log it says how many steps there are,
# then one "[done/total percent elapsed] what" line a step with no carriage return, then the
# time it took; on a terminal ninja redraws that line in place; up to date, it prints nothing.
#   tests/build_script_progress_test.sh SOURCE_DIR
set -uo pipefail
SOURCE=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export BITSPLIT_BUILD_DIR=$TMP/build
mkdir -p "$BITSPLIT_BUILD_DIR"
cat >"$BITSPLIT_BUILD_DIR/build.ninja" <<'EOF'
rule make
  command = sleep 0.2 && touch $out
  description = making $out
build a: make
build b: make
build c: make
EOF

"$SOURCE/scripts/build.sh" >"$TMP/log" 2>&1 || { cat "$TMP/log"; fail "build.sh failed"; }
cat "$TMP/log"
grep -q $'\r' "$TMP/log" && fail "a log got carriage returns"
grep -qx "build: 3 step(s) to run in $BITSPLIT_BUILD_DIR" "$TMP/log" ||
  fail "no line saying how many steps there are"
for step in "1/3  33% [0-9.]*s\] making [abc]" "2/3  66% [0-9.]*s\] making [abc]" \
  "3/3 100% [0-9.]*s\] making [abc]"; do
  grep -qx "\[$step" "$TMP/log" || fail "no progress line [$step"
done
grep -qx "build: done in 0m0[0-9]s" "$TMP/log" || fail "no line with the time it took"

"$SOURCE/scripts/build.sh" >"$TMP/log" 2>&1 || { cat "$TMP/log"; fail "build.sh failed up to date"; }
[[ -s $TMP/log ]] && { cat "$TMP/log"; fail "build.sh printed something with nothing to do"; }

# script(1) gives ninja a terminal: the status line is redrawn with a carriage return and an
# erase-to-end-of-line.
if command -v script >/dev/null; then
  rm "$BITSPLIT_BUILD_DIR/b"
  TERM=xterm script -qec "$SOURCE/scripts/build.sh" /dev/null >"$TMP/tty" 2>&1 ||
    { cat "$TMP/tty"; fail "build.sh failed on a terminal"; }
  grep -q $'\r\[1/1 100% [0-9.]*s\] making b\e\[K' "$TMP/tty" ||
    { cat -A "$TMP/tty"; fail "on a terminal the status line is not redrawn in place"; }
fi
echo "PASS"
