#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz in their own clang tree (build-fuzz, ASan + UBSan),
# writes their seed corpora (make_fuzz_seeds) and runs each target for N seconds, one after the
# other; fails on any crash, sanitizer report, leak, timeout or out-of-memory. Findings land in
# build-fuzz/fuzz-artifacts/; the corpus grows in build-fuzz/fuzz-corpus/ from run to run.
#
#   scripts/fuzz.sh                                 every target, 30 s each (what CI runs)
#   scripts/fuzz.sh --seconds 3600 gguf_config_fuzz one target for an hour
#   nice -n 19 scripts/fuzz.sh --runs 10000000      every target for 10 M executions
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BITSPLIT_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
ALL=(gguf_config_fuzz split_file_fuzz generate_request_fuzz shm_request_fuzz)
seconds=30
runs=""
targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ ${#targets[@]} -gt 0 ]] || targets=("${ALL[@]}")

# The largest input each target is given: a tiny model with its tokenizer, a tiny split model,
# a request with a prompt longer than most, a shared-memory header and 16 requests.
max_len() {
  case "$1" in
    gguf_config_fuzz|split_file_fuzz) echo 65536 ;;
    generate_request_fuzz) echo 8192 ;;
    *) echo 512 ;;
  esac
}

if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DBITSPLIT_FUZZ=ON -DBITSPLIT_CUDA=OFF
fi
flock /tmp/bitsplit-build.lock cmake --build "$BUILD" --target "${targets[@]}" make_fuzz_seeds

"$BUILD/tests/fuzz/make_fuzz_seeds" "$BUILD/fuzz-seeds" >/dev/null
mkdir -p "$BUILD/fuzz-artifacts"
status=0
for target in "${targets[@]}"; do
  corpus="$BUILD/fuzz-corpus/$target"
  mkdir -p "$corpus"
  limit=(-max_total_time="$seconds")
  [[ -z "$runs" ]] || limit=(-runs="$runs")
  echo "== $target (${runs:+$runs runs}${runs:-$seconds s})"
  log="$BUILD/fuzz-artifacts/$target.log"
  if ! "$BUILD/tests/fuzz/$target" "${limit[@]}" -max_len="$(max_len "$target")" -timeout=10 \
      -rss_limit_mb=2560 -print_final_stats=1 -artifact_prefix="$BUILD/fuzz-artifacts/$target-" \
      "$corpus" "$BUILD/fuzz-seeds/$target" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "fuzz.sh: $target FAILED (log: $log)" >&2
    status=1
    continue
  fi
  grep -E "^stat::number_of_executed_units|^stat::average_exec_per_sec|^#[0-9]+.*DONE" "$log" || true
done
exit $status
