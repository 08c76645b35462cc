#!/usr/bin/env bash
# The device check (the CUDA backend, and the CPU kernels on the GPU machine's host): one short
# run on a machine that has no gRPC, absl or GoogleTest packages (docs/cuda.md). Two halves:
#
#   here (the build machine, nvcc, no GPU needed):
#     bash scripts/device-check.sh --prepare [BUILD_DIR]      (default build-device)
#       configures a Release build for sm_90 (H100/H200; CUDA_ARCHS=... to change), builds the
#       CUDA tests, the benches, bitsplit-residual and bitsplit, and bundles them with the shared
#       libraries they need into BUILD_DIR/bundle/{bin,lib} (stripped, ~60 MB) and
#       BUILD_DIR/bundle.tar.xz (~10 MB): carry the latter.
#
#   on the device (from the repository root):
#     bash scripts/device-check.sh BUNDLE_TAR_XZ_OR_DIR_OR_BUILD_DIR
#       runs, within DEVICE_CHECK_SECONDS (default 480) of wall clock, the groups CHECKS names
#       in that order (default "cuda cpu"; "cpu" alone needs no GPU):
#         a load check of the binaries (missing libraries named), then
#         cuda: 1. nvidia-smi
#               2. cuda_kernels_test: every kernel against its CPU reference (bit for bit / NMSE)
#               3. cuda_model_test: forward vs CPU, batch invariance, the losslessness test
#                  (speculative == plain decoding on the device, greedy and sampled), VRAM-plan
#                  refusals. The RealModel* tests need models/ (not carried: 98 MB) and are
#                  skipped unless present.
#               4. cuda_drafter_bench: synthetic 8B-class model, VRAM budget below its Q8_0
#                  size, residual on this machine's cores; ACCEPTANCE=<mean accepted tokens per
#                  verify on the real model> adds the projection for it.
#         cpu:  the split kernels and the cpu-residual service on this machine's cores (the
#               many-core kernel and service figures, which the 2-core build machine cannot show):
#               5. kernel_bench --threads=<all> over b2_sym, b3_sym, b4_sym, r6/g32, r8/g32
#                  (kernel_bench.txt)
#               6. with models/ present: bitsplit quantize of SmolLM2's r6/g32 residual
#               7. residual_bench --threads <all but one> --synthetic-1b (and SmolLM2's
#                  residual when step 6 made it) (residual_bench.txt)
#       Logs, gtest XML, bench JSON and tables go to $OUT (or ./device-check-out); the exit status
#       is non-zero when a step failed.
#
#   with the real-model tests (SmolLM2, 98 MB: over the 64 MiB a call may carry with the tree):
#     here:    bash scripts/device-check.sh --prepare-carry [BUILD_DIR]
#                builds the bundle, then writes .devcarry/a (the first half of the xz-compressed
#                GGUF) and .devcarry/b (the second half, its sha256, the bundle as .tar.xz); git
#                ignores .devcarry
#     device:  call 1, carry [".devcarry/a"]:  bash scripts/device-check.sh --stage-first-half
#              call 2 at once (the machine keeps /root/devstate only while warm, 30 s),
#              carry [".devcarry/b"]:          bash scripts/device-check.sh --from-carry
#                rebuilds and checks the GGUF into models/, unpacks the bundle, runs the check
#                above with the RealModel tests, then compute-sanitizer's memcheck on
#                cuda_kernels_test (sanitizer-memcheck.log); with PROFILE=1 also ncu on a
#                2-layer model (ncu_matmul.txt, ncu_kernels.txt; about a minute more)
#              Both groups take longer than one call may run (600 s), so split them:
#              CHECKS=cpu on call 2, then at once, without carry, CHECKS=cuda ... --from-carry
#              (it reuses the bundle and the GGUF that call 2 left on the warm machine)
set -u -o pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
binaries=(tests/cuda_kernels_test tests/cuda_model_test bench/cuda_drafter_bench
  bench/kernel_bench bench/residual_bench services/cpu-residual/bitsplit-residual
  tools/bitsplit/bitsplit)
default_checks="cuda cpu"
# The formats kernel_bench times on the device: the draft bases and the residuals.
kernel_bench_filter='BM_SplitMatMul/(b2_sym|b3_sym|b4_sym|r6/g32|r8/g32)/'

unpack_bundle() {  # unpack_bundle TAR_XZ DIR: DIR/bundle/{bin,lib}, with Python's tarfile
  python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2"
}

prepare() {
  local build_dir="${1:-build-device}"
  local archs="${CUDA_ARCHS:-90}"
  cd "$repo_root" || exit 1
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$archs" -DBITSPLIT_CUDA=ON >/dev/null || exit 1
  ninja -C "$build_dir" "${binaries[@]##*/}" || exit 1
  local bundle="$build_dir/bundle"
  rm -rf "$bundle"
  mkdir -p "$bundle/bin" "$bundle/lib"
  local binary lib
  for binary in "${binaries[@]}"; do
    cp "$build_dir/$binary" "$bundle/bin/"
    strip "$bundle/bin/${binary##*/}"
    # Every shared library except the C/C++ runtime and the driver, which the device has.
    ldd "$build_dir/$binary" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libgcc_s.so.*|libstdc++.so.*|\
        ld-linux*|libcuda.so.*) ;;
        *) cp -L -n "$lib" "$bundle/lib/" ;;
      esac
    done
  done
  # The bundle itself (~60 MB with the gRPC libraries) and the tree exceed what a call may carry
  # (64 MiB); compressed it is ~10 MB.
  tar -C "$build_dir" -cJf "$bundle.tar.xz" bundle || exit 1
  echo "bundle: $bundle ($(du -sh "$bundle" | cut -f1)), $bundle.tar.xz ($(du -sh "$bundle.tar.xz" | cut -f1)); on the device run:"
  echo "  bash scripts/device-check.sh $bundle.tar.xz"
}

run() {
  local dir="$1"
  if [[ -f "$dir" && "$dir" == *.tar.xz ]]; then  # a compressed bundle: unpack it first
    local unpacked
    unpacked="$(mktemp -d /tmp/bitsplit-bundle.XXXXXX)"
    unpack_bundle "$dir" "$unpacked" || exit 1
    dir="$unpacked/bundle"
  fi
  local out="${OUT:-$repo_root/device-check-out}"
  mkdir -p "$out"
  local log="$out/device-check.log"
  local budget="${DEVICE_CHECK_SECONDS:-480}"
  local start=$SECONDS
  local failed=0
  local bin lib
  if [[ -d "$dir/bin" ]]; then
    bin="$dir/bin"
    lib="$dir/lib"
  else  # a build directory
    bin=""
    lib=""
  fi
  path_of() {  # the binary's path in a bundle or a build directory
    if [[ -n "$bin" ]]; then echo "$bin/$(basename "$1")"; else echo "$dir/$1"; fi
  }
  export LD_LIBRARY_PATH="${lib:+$lib:}${LD_LIBRARY_PATH:-}"
  left() { echo $((budget - (SECONDS - start))); }
  step() {  # step NAME CAP_SECONDS COMMAND...: runs with the smaller of CAP and the time left
    local name="$1" cap="$2"
    shift 2
    local limit
    limit=$(left)
    ((limit > cap)) && limit=$cap
    if ((limit < 10)); then
      echo "== $name: SKIPPED (wall-clock budget spent)" | tee -a "$log"
      failed=1
      return
    fi
    echo "== $name (limit ${limit}s): $*" | tee -a "$log"
    local step_start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
    local status=${PIPESTATUS[0]}
    echo "== $name: exit $status after $((SECONDS - step_start))s" | tee -a "$log"
    if ((status != 0)); then failed=1; fi
  }

  local checks="${CHECKS:-$default_checks}" group
  for group in $checks; do
    case "$group" in
      cuda|cpu) ;;
      *) echo "CHECKS: unknown group '$group' (cuda, cpu)" >&2; exit 2 ;;
    esac
  done
  : >"$log"
  echo "device check from $dir, checks: $checks, budget ${budget}s, output $out" | tee -a "$log"
  local missing=0 b
  for b in "${binaries[@]}"; do
    if ldd "$(path_of "$b")" 2>&1 | grep -q "not found"; then
      echo "MISSING LIBRARIES for $b:" | tee -a "$log"
      ldd "$(path_of "$b")" | grep "not found" | tee -a "$log"
      missing=1
    fi
  done
  if ((missing)); then
    echo "FAIL: libraries missing; rebuild the bundle with --prepare" | tee -a "$log"
    exit 1
  fi
  local gguf="$repo_root/models/$model_file"
  cuda_checks() {
    step "nvidia-smi" 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.free,clocks.max.sm --format=csv
    # Real-model tests need models/ (the SmolLM2 GGUF is not carried).
    local model_filter="-*RealModel*"
    if [[ -f "$gguf" ]]; then model_filter="*"; fi
    step "cuda_kernels_test" 240 "$(path_of tests/cuda_kernels_test)" \
      --gtest_output="xml:$out/cuda_kernels_test.xml"
    step "cuda_model_test" 240 "$(path_of tests/cuda_model_test)" --gtest_filter="$model_filter" \
      --gtest_output="xml:$out/cuda_model_test.xml"
    local bench_args=(--json "$out/cuda_drafter_bench.json" --max-seconds 200)
    if [[ -n "${ACCEPTANCE:-}" ]]; then bench_args+=(--acceptance "$ACCEPTANCE"); fi
    if [[ -n "${VRAM_BUDGET_GIB:-}" ]]; then bench_args+=(--vram-budget-gib "$VRAM_BUDGET_GIB"); fi
    step "cuda_drafter_bench" 280 "$(path_of bench/cuda_drafter_bench)" "${bench_args[@]}"
  }
  cpu_checks() {
    local cpus work
    cpus=$(nproc)
    work="$(mktemp -d /tmp/bitsplit-device-cpu.XXXXXX)"
    # A bench's output also goes to its own file: FILE COMMAND... after this prefix.
    local teed=(bash -o pipefail -c '"${@:2}" | tee "$1"' _)
    lscpu | grep -E "^(Model name|Socket|Core|Thread|NUMA node\(s\)|L3)" | tee -a "$log"
    step "kernel_bench" 200 "${teed[@]}" "$out/kernel_bench.txt" "$(path_of bench/kernel_bench)" \
      --threads="$cpus" --benchmark_filter="$kernel_bench_filter"
    local residual_args=(--threads "$((cpus > 1 ? cpus - 1 : 1))" --synthetic-1b
      --workdir "$work" --service "$(path_of services/cpu-residual/bitsplit-residual)")
    if [[ -f "$gguf" ]]; then
      step "bitsplit quantize (SmolLM2 r6/g32 residual)" 120 "$(path_of tools/bitsplit/bitsplit)" \
        quantize "$gguf" -o "$work/smol" --residual-bits 6 --threads "$cpus"
      if [[ -f "$work/smol.residual.bsplit" ]]; then
        residual_args+=(--residual "$work/smol.residual.bsplit")
      fi
    fi
    step "residual_bench" 200 "${teed[@]}" "$out/residual_bench.txt" \
      "$(path_of bench/residual_bench)" "${residual_args[@]}"
    rm -rf "$work"
  }
  for group in $checks; do
    "${group}_checks"
  done
  {
    echo "summary:"
    grep -E "^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]+ test|^== .*: (exit|SKIPPED)" "$log"
  } | tee "$out/summary.txt"
  echo "device check $([[ $failed == 0 ]] && echo PASSED || echo FAILED) in $((SECONDS - start))s" |
    tee -a "$out/summary.txt"
  exit "$failed"
}

model_file=SmolLM2-135M-Instruct.Q4_1.gguf
carry_dir="$repo_root/.devcarry"
devstate="${DEVSTATE:-/root/devstate}"

prepare_carry() {
  local build_dir="${1:-build-device}"
  (prepare "$build_dir") || exit 1
  cd "$repo_root" || exit 1
  local model
  model="$(readlink -f "models/$model_file")"
  [[ -f "$model" ]] || { echo "models/$model_file missing: run scripts/setup.sh" >&2; exit 1; }
  grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.devcarry/' >>.git/info/exclude; }
  rm -rf "$carry_dir"
  mkdir -p "$carry_dir/a" "$carry_dir/b"
  echo "compressing $model_file (about a minute)"
  xz -9 -T2 -c "$model" >"$carry_dir/model.xz" || exit 1
  # 50 MB first: the second call carries the rest, the bundle and the tree within 64 MiB.
  head -c 50000000 "$carry_dir/model.xz" >"$carry_dir/a/model.xz.a"
  tail -c +50000001 "$carry_dir/model.xz" >"$carry_dir/b/model.xz.b"
  rm "$carry_dir/model.xz"
  sha256sum "$model" | cut -d' ' -f1 >"$carry_dir/b/model.sha256"
  cp "$build_dir/bundle.tar.xz" "$carry_dir/b/bundle.tar.xz" || exit 1
  du -sh "$carry_dir/a" "$carry_dir/b"
  echo 'device, call 1: run(command="bash scripts/device-check.sh --stage-first-half", carry=[".devcarry/a"], timeout_s=60)'
  echo 'device, call 2 at once: run(command="CHECKS=cpu bash scripts/device-check.sh --from-carry", carry=[".devcarry/b"], timeout_s=500)'
  echo 'device, call 3 at once: run(command="CHECKS=cuda bash scripts/device-check.sh --from-carry", timeout_s=500)'
}

stage_first_half() {
  mkdir -p "$devstate" && cp "$carry_dir/a/model.xz.a" "$devstate/" && ls -l "$devstate"
}

from_carry() {
  cd "$repo_root" || exit 1
  mkdir -p "$devstate" models
  local gguf="models/$model_file"
  if [[ -f "$carry_dir/b/bundle.tar.xz" ]]; then
    if [[ -f "$devstate/model.xz.a" ]]; then
      cat "$devstate/model.xz.a" "$carry_dir/b/model.xz.b" |
        python3 -c "import lzma,sys,shutil; shutil.copyfileobj(lzma.LZMAFile(sys.stdin.buffer), sys.stdout.buffer, 1 << 20)" >"$gguf"
      echo "$(cat "$carry_dir/b/model.sha256")  $gguf" | sha256sum -c || rm -f "$gguf"
    else
      echo "the first half is not on this machine (a fresh one): the RealModel tests are skipped"
    fi
    unpack_bundle "$carry_dir/b/bundle.tar.xz" "$devstate" || exit 1
  elif [[ -d "$devstate/bundle/bin" ]]; then
    # A later call on the same warm machine (e.g. CHECKS=cuda after CHECKS=cpu), without carry.
    echo "no .devcarry/b: reusing $devstate/bundle and models/ from an earlier call"
  else
    echo "neither .devcarry/b nor an unpacked $devstate/bundle: carry .devcarry/b" >&2
    exit 1
  fi
  export BITSPLIT_MODELS_DIR="$repo_root/models"
  ACCEPTANCE="${ACCEPTANCE:-1.72}" DEVICE_CHECK_SECONDS="${DEVICE_CHECK_SECONDS:-400}" \
    bash "${BASH_SOURCE[0]}" "$devstate/bundle"
  local status=$?
  local out="${OUT:-$repo_root/device-check-out}" sanitizer
  sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
  local with_cuda=0
  [[ " ${CHECKS:-$default_checks} " == *" cuda "* ]] && with_cuda=1
  if ((with_cuda)) && [[ -n "$sanitizer" ]]; then
    LD_LIBRARY_PATH="$devstate/bundle/lib" timeout --kill-after=5 100 "$sanitizer" --tool memcheck \
      --error-exitcode 3 "$devstate/bundle/bin/cuda_kernels_test" >"$out/sanitizer-memcheck.log" 2>&1
    local sanitizer_status=$?
    echo "compute-sanitizer memcheck on cuda_kernels_test: exit $sanitizer_status" | tee -a "$out/summary.txt"
    tail -2 "$out/sanitizer-memcheck.log"
    ((sanitizer_status != 0)) && status=1
  fi
  # PROFILE=1: ncu on a 2-layer model of the bench's shape (ncu_matmul.txt: the split matmuls of
  # the base-matmul passes at T = 1 and 4, after the prefill's 9; ncu_kernels.txt: every kernel,
  # summarized per kernel and launch shape).
  local ncu
  ncu="$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
  if ((with_cuda)) && [[ "${PROFILE:-0}" == 1 && -n "$ncu" ]]; then
    local small=(--layers 2 --prompt 16 --repetitions 1 --max-seconds 60 --vram-budget-gib 8)
    LD_LIBRARY_PATH="$devstate/bundle/lib" timeout --kill-after=5 150 "$ncu" --clock-control none \
      --kernel-name regex:SplitMatMulKernel --launch-skip 9 --launch-count 18 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis "$devstate/bundle/bin/cuda_drafter_bench" "${small[@]}" \
      >"$out/ncu_matmul.txt" 2>&1
    echo "ncu (split matmuls): exit $?" | tee -a "$out/summary.txt"
    LD_LIBRARY_PATH="$devstate/bundle/lib" timeout --kill-after=5 150 "$ncu" --clock-control none \
      --section SpeedOfLight --print-summary per-kernel "$devstate/bundle/bin/cuda_drafter_bench" \
      "${small[@]}" >"$out/ncu_kernels.txt" 2>&1
    echo "ncu (every kernel): exit $?" | tee -a "$out/summary.txt"
  fi
  exit "$status"
}

case "${1:-}" in
  --prepare) prepare "${2:-}" ;;
  --prepare-carry) prepare_carry "${2:-}" ;;
  --stage-first-half) stage_first_half ;;
  --from-carry) from_carry ;;
  ""|-h|--help)
    sed -n '2,49p' "${BASH_SOURCE[0]}"
    exit 2
    ;;
  *) run "$1" ;;
esac
