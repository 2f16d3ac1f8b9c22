#!/usr/bin/env bash
# The real-text benchmark of the training modes (docs/modes.md, "On real text"): trains the GPT
# of examples/configs/realtext-gpt.toml on the fortune cookies of Debian's `fortunes` package in
# every mode at equal tokens — gpipe and 1f1b at 4 stages, 2bw, pipedream and xpipe at 2 and 4
# stages, each without and with every delay correction (optimizer.delay_correction: none,
# nesterov, dc, secant, dc+nesterov, secant+nesterov; "nadam" is nesterov with NAdam's momentum
# schedule, optimizer.momentum_decay = 0.004; xpipe takes only the look-ahead) and with AdamW in
# a rotated basis ("rot": optimizer.basis_rotation, alone and with nesterov; gpipe with it too, the
# reference at the same optimizer; "rot32": the same in blocks of 32, optimizer.rotation_block)
# — at each
# learning rate given, then prints the table of final losses, writes it as Markdown and draws
# the training and held-out loss curves (PNG, gnuplot).
#
#   scripts/realtext.sh [--out DIR] [--jobs N] [--lrs "3e-3 1e-3"] [--steps N] [--only REGEX]
#                       [--corpus-only]
#
# --out DIR      where the runs, table.md and the plots go (build/realtext)
# --jobs N       runs at once (2); each run is one thread (the serial backend: the same bits as
#                the stage actors, docs/architecture.md), so N cores are busy
# --lrs "A B"    peak learning rates (min_lr is a tenth of each)
# --steps N      optimizer steps of the synchronous modes (600); pipedream runs 4·N updates of
#                one microbatch each, the same tokens
# --only REGEX   run only the runs whose name (lr<lr>-<mode>-d<stages>-<correction>) matches
#                the extended regular expression; the table and plots still take every run in
#                DIR (a run done before is kept, not run again)
# --corpus-only  only install the package and write DIR/fortunes.txt
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/realtext jobs=2 lrs="3e-3 1e-3" steps=600 corpus_only=0 only=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --lrs) lrs="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --corpus-only) corpus_only=1; shift ;;
    *) echo "realtext: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "realtext: --jobs $jobs: expected a count >= 1" >&2; exit 2; }
[[ "$steps" =~ ^[1-9][0-9]*$ && "$steps" -ge 20 ]] || { echo "realtext: --steps $steps: expected >= 20" >&2; exit 2; }

scripts/setup.sh --realtext
mkdir -p "$out"
# the corpus: every fortune file but the two of ASCII art, in name order
src=/usr/share/games/fortunes
corpus="$out/fortunes.txt"
files=$(find "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name art ! -name ascii-art \
          -printf '%f\n' | LC_ALL=C sort)
[[ -n "$files" ]] || { echo "realtext: no fortune files in $src (is the fortunes package installed?)" >&2; exit 1; }
(cd "$src" && cat $files) > "$corpus.tmp" && mv "$corpus.tmp" "$corpus"
echo "realtext: corpus $corpus, $(wc -c < "$corpus") bytes from $(echo "$files" | wc -l) files of $src"
[[ $corpus_only -eq 1 ]] && exit 0

scripts/build.sh --target actorpipe-gpt
gpt="${BUILD_DIR:-build}/examples/gpt/actorpipe-gpt"

# one line per run: name and its --set arguments
runs="$out/runs.txt"
: > "$runs"
every=$((steps / 12))
for lr in $lrs; do
  min=$(python3 -c "print(f'{float(\"$lr\") / 10:g}')")
  common="--set data.path=$corpus --set optimizer.lr=$lr --set optimizer.min_lr=$min"
  common+=" --set train.steps=$steps --set optimizer.decay_steps=$steps --set eval.every=$every"
  for mode in gpipe 1f1b; do
    echo "lr$lr-$mode-d4-none $common --set pipeline.mode=$mode --set pipeline.stages=4" >> "$runs"
  done
  echo "lr$lr-gpipe-d4-rot $common --set pipeline.mode=gpipe --set pipeline.stages=4 --set optimizer.basis_rotation=true" >> "$runs"
  echo "lr$lr-gpipe-d4-rot32 $common --set pipeline.mode=gpipe --set pipeline.stages=4 --set optimizer.basis_rotation=true --set optimizer.rotation_block=32" >> "$runs"
  for d in 2 4; do
    for mode in 2bw pipedream xpipe; do
      for corr in none nesterov nadam dc secant dc+nesterov secant+nesterov rot rot+nesterov rot32 rot32+nesterov; do
        # xpipe refuses the compensations: nothing is stale in its backward
        [[ $mode == xpipe && $corr != none && $corr != nesterov && $corr != nadam && $corr != rot* ]] && continue
        set_mode="--set pipeline.mode=$mode --set pipeline.stages=$d"
        if [[ $corr == nadam ]]; then
          set_mode+=" --set optimizer.delay_correction=nesterov --set optimizer.momentum_decay=0.004"
        elif [[ $corr == rot* ]]; then
          set_mode+=" --set optimizer.basis_rotation=true"
          [[ $corr == rot32* ]] && set_mode+=" --set optimizer.rotation_block=32"
          [[ $corr == *+nesterov ]] && set_mode+=" --set optimizer.delay_correction=nesterov"
        else
          set_mode+=" --set optimizer.delay_correction=$corr"
        fi
        if [[ $mode == pipedream ]]; then  # an update per microbatch: 4x the updates, same tokens
          set_mode+=" --set pipeline.microbatches=1 --set train.steps=$((4 * steps))"
          set_mode+=" --set optimizer.warmup_steps=40 --set optimizer.decay_steps=$((4 * steps))"
          set_mode+=" --set eval.every=$((4 * every))"
        fi
        echo "lr$lr-$mode-d$d-$corr $common $set_mode" >> "$runs"
      done
    done
  done
done
if [[ -n "$only" ]]; then
  awk -v re="$only" '$1 ~ re' "$runs" > "$runs.only" && mv "$runs.only" "$runs"
  [[ -s "$runs" ]] || { echo "realtext: --only '$only' matches no run" >&2; exit 2; }
fi
n=$(wc -l < "$runs")
echo "realtext: $n runs, $jobs at a time, logs and metrics in $out"
run_one() {
  local name="$1"; shift
  if [[ -s "$out/$name.jsonl" ]] && grep -q '"eval"' "$out/$name.jsonl" && grep -q '^done' "$out/$name.log" 2>/dev/null; then
    echo "realtext: $name: done before, kept"; return 0
  fi
  rm -f "$out/$name.jsonl"
  if "$gpt" --config examples/configs/realtext-gpt.toml --backend serial \
       --set train.metrics="$out/$name.jsonl" --set train.log_every=0 "$@" > "$out/$name.log" 2>&1; then
    echo "realtext: $name: $(tail -n 1 "$out/$name.log")"
  else
    echo "realtext: $name FAILED (exit $?), see $out/$name.log" >&2; return 1
  fi
}
export -f run_one
export out gpt
xargs -P "$jobs" -L 1 bash -c 'run_one "$@"' _ < "$runs"
python3 scripts/realtext_report.py "$out" "$lrs"
