#!/usr/bin/env python3
"""Plots tau and RAM bytes per verify against base bits per weight from bench/budget_study.sh's
directories (one row of panels per model) into a PNG.

  python bench/budget_plot.py -o docs/bits_by_budget.png smollm2=DIR gemma3=DIR

Needs matplotlib: run it with the pinned environment of bench/plot-requirements.txt,
  "$(scripts/venv.sh plot bench/plot-requirements.txt matplotlib)" bench/budget_plot.py ...
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display: write the file only
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import budget_table  # noqa: E402

TAU_SERIES = (("tau16", "16-node tree", "o"), ("tau64", "64-node tree", "s"),
              ("tau_chain8", "8-chain", "^"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True, help="PNG to write")
    parser.add_argument("studies", nargs="+", metavar="NAME=DIR")
    args = parser.parse_args()
    studies = []
    for item in args.studies:
        name, sep, out = item.partition("=")
        if not sep or not os.path.isfile(os.path.join(out, "eval-uniform.json")):
            parser.error(f"'{item}' is not NAME=DIR with DIR holding budget_study.sh's results")
        studies.append((name, budget_table.load(out)))

    fig, axes = plt.subplots(len(studies), 2, figsize=(11, 4.2 * len(studies)), squeeze=False)
    for (name, (rows, q8)), (ax_tau, ax_ram) in zip(studies, axes):
        rows = sorted(rows, key=lambda r: r["base_bits"])
        bits = [r["base_bits"] for r in rows]
        for key, label, marker in TAU_SERIES:
            ax_tau.plot(bits, [r[key] for r in rows], marker=marker, linestyle="", label=label)
        b2r8 = next((r for r in rows if r["short"] == "b2+r8"), None)
        if b2r8:
            ax_tau.axhline(1.5 * b2r8["tau16"], color="grey", linestyle="--", linewidth=0.8,
                           label="1.5 x tau16 of b2+r8")
        names = {}  # configurations with the same base draft alike: one label per base
        for r in rows:
            names.setdefault(round(r["base_bits"], 3), []).append(r)
        for same in names.values():
            ax_tau.annotate(" / ".join(r["short"] for r in same),
                            (same[0]["base_bits"], max(r["tau16"] for r in same)),
                            textcoords="offset points", xytext=(6, -12), fontsize=8)
        ax_tau.set_title(f"{name}: accepted tokens per verify")
        ax_tau.set_xlabel("base bits per linear weight (in VRAM)")
        ax_tau.set_ylabel("tau (tokens per verify)")
        ax_tau.set_ylim(bottom=0)
        ax_tau.margins(x=0.15)
        ax_tau.legend(fontsize=8)
        ax_tau.grid(alpha=0.3)

        ax_ram.plot(bits, [r["ram_vs_q8"] for r in rows], marker="o", linestyle="",
                    color="tab:red", label="residual bytes per verify")
        ax_ram.axhline(0.55, color="grey", linestyle="--", linewidth=0.8, label="0.55 x Q8_0")
        for r in rows:
            ax_ram.annotate(f"{r['short']} (KL {r['kl']:.4f})", (r["base_bits"], r["ram_vs_q8"]),
                            textcoords="offset points", xytext=(5, 4), fontsize=8)
        ax_ram.set_title(f"{name}: RAM read per verify (Q8_0 KL {q8['summary']['kl_mean']:.4f})")
        ax_ram.set_xlabel("base bits per linear weight (in VRAM)")
        ax_ram.set_ylabel("RAM bytes / Q8_0 linear bytes")
        ax_ram.set_ylim(0, 1.1)
        ax_ram.margins(x=0.15)
        ax_ram.legend(fontsize=8)
        ax_ram.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"budget_plot: wrote {args.output}")


if __name__ == "__main__":
    main()
