#!/usr/bin/env python3
"""Prints the bits-by-budget table from bench/budget_study.sh's DIR (standard library only).

Per configuration: base bits per linear weight, RAM bytes one verify reads relative to Q8_0's
linear weights, the verifier's KL / top-1 / perplexity and the draft's KL on the eval corpus,
tokens per verify (16-node tree, 64-node tree, 8-chain), and projected tokens/s of a 16-node tree
for two machines: RAM 60 GB/s + VRAM 1 TB/s, and this machine's measured read bandwidth for both
(everything in RAM). Projection: tau / ((residual bytes / RAM + base bytes / VRAM) + 4 draft
forwards x base bytes / VRAM).
"""
import glob
import json
import os
import sys


def load(out):
    """The study's rows (plans by budget, then the uniform splits) and its Q8_0 reference."""
    evals = {c["label"]: c for path in sorted(glob.glob(os.path.join(out, "eval-*.json")))
             for c in json.load(open(path))["configs"]}
    spec = [r for path in sorted(glob.glob(os.path.join(out, "speculation-*.json")))
            for r in json.load(open(path))]
    q8 = evals["q8_0:norot"]
    weights = q8["weights"]["count"]
    q8_bytes = q8["weights"]["gpu_bytes_per_weight"] * weights
    local_bw = max(r["bandwidth_gbps"] for r in spec) * 1e9

    def tau(model, shape):
        for r in spec:
            if r["model"] == model and r["shape"] == shape and r["draft"] != "- (verifier alone)":
                return r["tokens_per_verify"]
        return float("nan")

    def label(head):  # the uniform configurations, with or without importance weighting
        return next((k for k in evals if k.startswith(head + ":")), head)

    configs = []
    for path in sorted(glob.glob(os.path.join(out, "plan-*.json")),
                       key=lambda p: int(os.path.basename(p)[5:-5])):
        pct = os.path.basename(path)[5:-5]
        plan = json.load(open(path))
        prefix = os.path.join(out, "v" + pct)
        base_share = int(pct) / 100 * plan["q8_0_bytes"]
        configs.append((f"plan {pct}% ({base_share / 2**20:.1f} MiB for the base, "
                        f"{plan['budget_bytes'] / 2**20:.1f} MiB in all)", f"plan {pct}%",
                        f"split:{prefix}", f"split-base:{prefix}", f"plan {pct}%"))
    for r in (6, 8):
        configs.append((f"uniform b2_asym + r{r}", f"b2+r{r}", label(f"b2+r{r}"), label("b2"),
                        f"b2_asym+r{r}"))
    rows = []
    for name, short, verify, draft, model in configs:
        v = evals.get(verify)
        if v is None:
            continue
        d = evals.get(draft)
        base = v["weights"]["gpu_bytes_per_weight"] * weights
        ram = v["weights"]["ram_bytes_per_weight"] * weights
        t16 = tau(model, "tree N=16 k=4")

        def tps(ram_bw, vram_bw):
            return t16 / (ram / ram_bw + base / vram_bw * 5)

        rows.append({
            "name": name, "short": short, "base_bits": 8 * base / weights,
            "ram_vs_q8": ram / q8_bytes, "kl": v["summary"]["kl_mean"],
            "top1": v["summary"]["top1_agreement"], "ppl": v["summary"]["perplexity"],
            "draft_kl": d["summary"]["kl_mean"] if d else float("nan"),
            "tau16": t16, "tau64": tau(model, "tree N=64 k=8"), "tau_chain8": tau(model, "chain 8"),
            "tps_60_1000": tps(60e9, 1e12), "tps_here": tps(local_bw, local_bw)})
    return rows, {"bits": 8 * q8_bytes / weights, "bytes": q8_bytes, "summary": q8["summary"],
                  "local_bw": local_bw}


def main(out):
    rows, q8 = load(out)
    print("| configuration | base bits/weight | RAM bytes vs Q8_0 | verify KL | top-1 | PPL | "
          "draft KL | tau 16-tree | tau 64-tree | tau 8-chain | tok/s 60 GB/s + 1 TB/s | "
          "tok/s here |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['base_bits']:.2f} | {r['ram_vs_q8']:.3f} | {r['kl']:.5f} | "
              f"{100 * r['top1']:.2f}% | {r['ppl']:.3f} | {r['draft_kl']:.3f} | "
              f"{r['tau16']:.2f} | {r['tau64']:.2f} | {r['tau_chain8']:.2f} | "
              f"{r['tps_60_1000']:.0f} | {r['tps_here']:.0f} |")
    s = q8["summary"]
    print(f"| Q8_0 (ours, not rotated) | {q8['bits']:.2f} | 1.000 (all in VRAM) | "
          f"{s['kl_mean']:.5f} | {100 * s['top1_agreement']:.2f}% | {s['perplexity']:.3f} | | | | "
          f"| | |")
    print(f"\nQ8_0 linear weights: {q8['bytes'] / 2**20:.1f} MiB; this machine's read bandwidth "
          f"{q8['local_bw'] / 1e9:.1f} GB/s (speculation_bench)")


if __name__ == "__main__":
    main(sys.argv[1])
