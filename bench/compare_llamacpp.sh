#!/usr/bin/env bash
# Prefill (256-token prompt) and decode tokens/s of bitsplit's reference engine and of llama.cpp
# (llama-cpp-python, built by scripts/oracle-env.sh), same model, same threads, one run.
#   bench/compare_llamacpp.sh [--exact-gelu] [MODEL] [THREADS]
# --exact-gelu: llama.cpp built with its CPU GELU as the f32 formula (oracle-env.sh --exact-gelu),
# the arithmetic bitsplit computes; it differs from the release only in gemma's GELU.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV_FLAGS=()
if [[ "${1:-}" == --exact-gelu ]]; then ENV_FLAGS=(--exact-gelu); shift; fi
MODEL="${1:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
THREADS="${2:-$(nproc)}"
PY="$("$ROOT/scripts/oracle-env.sh" "${ENV_FLAGS[@]}")"
"$ROOT/scripts/build.sh" >/dev/null
ours=$("$ROOT/build/bench/engine_speed_bench" --model "$MODEL" --threads "$THREADS" \
  --benchmark_format=json 2>/dev/null)
theirs=$("$PY" "$ROOT/bench/llamacpp_speed.py" --model "$MODEL" --threads "$THREADS")
"$PY" - "$ours" "$theirs" "$MODEL" "$THREADS" <<'PYEOF'
import json, sys
ours = {b["name"].split("/")[0]: b["tokens_per_s"] for b in json.loads(sys.argv[1])["benchmarks"]}
theirs = json.loads(sys.argv[2])
print(f"model {sys.argv[3].split('/')[-1]}, {sys.argv[4]} threads, prompt 256 tokens, decode 64 tokens")
print("| engine | prefill tok/s | decode tok/s |")
print("|---|---|---|")
print(f"| bitsplit reference (f32 compute) | {ours['BM_Prefill']:.1f} | {ours['BM_Decode']:.1f} |")
print(f"| {theirs['engine']} | {theirs['prefill_tokens_per_s']:.1f} | {theirs['decode_tokens_per_s']:.1f} |")
print(f"| ratio bitsplit / llama.cpp | {ours['BM_Prefill']/theirs['prefill_tokens_per_s']:.2f} | {ours['BM_Decode']/theirs['decode_tokens_per_s']:.2f} |")
PYEOF
