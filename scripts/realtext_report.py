#!/usr/bin/env python3
"""The real-text benchmark's report (scripts/realtext.sh): reads OUT/<run>.jsonl (train.metrics
of every run: one line per step, one per held-out evaluation), prints the table of final losses
per learning rate, writes it to OUT/table.md and draws OUT/realtext-lr<lr>.png (gnuplot): the
training loss (mean of 25 steps) and the held-out loss against tokens, at 4 stages.

usage: realtext_report.py OUT "LR [LR ...]"
"""
import json
import os
import subprocess
import sys

MODES = ["gpipe", "1f1b", "2bw", "pipedream", "xpipe"]
CORRECTIONS = ["none", "nesterov", "nadam", "dc", "secant", "dc+nesterov", "secant+nesterov",
               "rot", "rot+nesterov", "rot32", "rot32+nesterov"]
# nadam: nesterov with momentum_decay 0.004; rot: optimizer.basis_rotation (gpipe too); rot32:
# the same with optimizer.rotation_block = 32


def load(path):
    steps, evals = [], []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "eval" in r:
                evals.append((r["eval"]["step"], r["eval"]["loss"]))
            elif "loss" in r:
                steps.append((r["step"], r["tokens"], r["loss"]))
    return steps, evals


def summary(steps, evals):
    """Mean training loss of the last 5% of steps, the last held-out loss, tokens per step."""
    tail = max(1, len(steps) // 20)
    train = sum(s[2] for s in steps[-tail:]) / tail
    held = evals[-1][1] if evals else float("nan")
    per_step = steps[-1][1] / steps[-1][0]
    return train, held, per_step


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out, lrs = sys.argv[1], sys.argv[2].split()
    md = []
    for lr in lrs:
        runs = {}
        for mode in MODES:
            for d in (2, 4):
                for corr in CORRECTIONS:
                    path = os.path.join(out, f"lr{lr}-{mode}-d{d}-{corr}.jsonl")
                    if os.path.exists(path) and os.path.getsize(path) > 0:
                        runs[(mode, d, corr)] = load(path)
        ref = runs.get(("gpipe", 4, "none"))
        if ref is None:
            print(f"realtext: lr {lr}: no gpipe run in {out}", file=sys.stderr)
            continue
        ref_held = summary(*ref)[1]
        title = f"lr {lr} (peak; cosine to {float(lr) / 10:g}), equal tokens"
        header = "| mode | stages | correction | training loss (last 5%) | held-out loss | vs gpipe |"
        print(f"\n{title}")
        print(f"{'mode':<10} {'stages':>6} {'correction':<16} {'train':>7} {'held-out':>9} {'vs gpipe':>9}")
        md += [f"**{title}**", "", header, "|---|---|---|---|---|---|"]
        best = {}
        for (mode, d, corr), (steps, evals) in sorted(
                runs.items(), key=lambda kv: (MODES.index(kv[0][0]), kv[0][1], CORRECTIONS.index(kv[0][2]))):
            train, held, _ = summary(steps, evals)
            rel = 100.0 * (held / ref_held - 1.0)
            print(f"{mode:<10} {d:>6} {corr:<16} {train:>7.3f} {held:>9.3f} {rel:>+8.1f}%")
            md.append(f"| {mode} | {d} | {corr} | {train:.3f} | {held:.3f} | {rel:+.1f}% |")
            if corr != "none" and mode not in ("gpipe", "1f1b") and (
                    held < best.get((mode, d), (float("inf"),))[0]):
                best[(mode, d)] = (held, corr)
        md.append("")
        plot(out, lr, runs, best)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"\nrealtext: wrote {os.path.join(out, 'table.md')} and the plots realtext-lr<lr>.png in {out}")


def plot(out, lr, runs, best):
    """Training (mean of 25 steps) and held-out loss against tokens at 4 stages: every mode
    uncorrected (solid), gpipe with the basis rotation and the async modes with their best
    correction (dashed)."""
    series = []
    for mode in MODES:
        if (mode, 4, "none") in runs:
            series.append((mode, "none", f"{mode}", 1))
        if mode == "gpipe" and (mode, 4, "rot") in runs:  # the reference at the same optimizer
            series.append((mode, "rot", "gpipe + rot", 2))
        if (mode, 4) in best:
            corr = best[(mode, 4)][1]
            series.append((mode, corr, f"{mode} + {corr}", 2))
    colors = {"gpipe": "#000000", "1f1b": "#777777", "2bw": "#d62728", "pipedream": "#1f77b4",
              "xpipe": "#2ca02c"}
    files = []
    for mode, corr, label, dash in series:
        steps, evals = runs[(mode, 4, corr)]
        base = os.path.join(out, f"plot-lr{lr}-{mode}-{corr}")
        per_step = steps[-1][1] / steps[-1][0]
        with open(base + ".train", "w") as f:
            window = min(25 * (4 if mode == "pipedream" else 1), max(1, len(steps) // 4))
            for i in range(window, len(steps) + 1, max(1, window // 5)):
                chunk = steps[i - window:i]
                f.write(f"{chunk[-1][1] / 1e6:.6f} {sum(s[2] for s in chunk) / len(chunk):.5f}\n")
        with open(base + ".eval", "w") as f:
            for step, loss in evals:
                f.write(f"{step * per_step / 1e6:.6f} {loss:.5f}\n")
        files.append((base, label, colors[mode], dash))
    png = os.path.join(out, f"realtext-lr{lr}.png")
    gp = [f"set terminal pngcairo size 1400,560 font 'sans,11'", f"set output '{png}'",
          "set multiplot layout 1,2", "set grid", "set xlabel 'tokens (millions)'",
          "set key top right", "set yrange [1.7:3.6]"]
    for title, ext, style in (("training loss (mean of 25 steps)", "train", "lines"),
                              ("held-out loss", "eval", "linespoints")):
        gp.append(f"set title '{title}, lr {lr}, 4 stages'")
        parts = [f"'{b}.{ext}' using 1:2 with {style} lw 2 dt {dash} lc rgb '{c}' title '{label}'"
                 for b, label, c, dash in files]
        gp.append("plot " + ", \\\n     ".join(parts))
    gp.append("unset multiplot")
    script = os.path.join(out, f"plot-lr{lr}.gp")
    with open(script, "w") as f:
        f.write("\n".join(gp) + "\n")
    subprocess.run(["gnuplot", script], check=True)


if __name__ == "__main__":
    main()
