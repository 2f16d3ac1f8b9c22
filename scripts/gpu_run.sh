#!/usr/bin/env bash
# The GPU checks of a bundle made by scripts/gpu_bundle.sh (copied there as run.sh), run on the GPU
# machine. Every check's output goes to ${OUT:-./results}/log.txt and a line per check (passed,
# FAILED with its exit status, or not run for lack of time) to summary.txt. Exits non-zero when a
# check fails. BUDGET (seconds, default 480) bounds the whole run: a check whose own limit would
# pass it is not started. DEVICE (default cuda) is the pipeline.device of the GPU runs:
# DEVICE=checked runs the same flow on any machine, without the checks that need a GPU
# (compute-sanitizer, the bench and the trainer at its shape): tests.cuda.gpu_run_checked.
#
# The checks:
# - every test of tests.txt (doctest programs; on a GPU no case may print "SKIPPED: " except the
#   ones whose CPU reference needs bf16 instructions);
# - actorpipe-gpt on 2 GPU stages against the same run on the CPU: every step's loss within
#   1e-3 relative (three products' orders apart, over the default run's first steps);
# - the multi-process oracle (tests/multiprocess/same_bits.cmake): 2 processes with their stages
#   on the GPU against 1 process on the GPU, every checkpoint file byte for byte, with the tensors
#   between the processes over NCCL (1f1b, xpipe, and 2bw with layer moves across the processes;
#   the output must show NCCL in use) and over host-staged UCX (1f1b, 2bw with moves; no NCCL);
#   the two ranks share the one GPU as two NCCL "hosts" (NCCL_HOSTID, sockets on loopback);
# - --sample on the GPU from the GPU run's checkpoint;
# - a model too large for the GPU: exit 1 naming the GPU's memory, cuda:0;
# - compute-sanitizer's memcheck over the repeat tests of the GPU pipeline and of the Trainer on
#   the actors (stages and shards on streams of their own);
# - actorpipe-bench-device's small step in fp32, and the GPT trainer at that shape (4
#   microbatches a step) on 1 and 2 stages of the GPU, and on 2 processes of a stage each over
#   NCCL and over UCX, for their tokens per second;
# - where the bundle holds bin/actorpipe-bench-cpu (CPU_MARCH): the CPU step of the GPT small
#   shape at 1 and 2 threads in fp32 and bf16 beside that machine's PyTorch, with the CPU's
#   topology, and with OPENBLAS_CORETYPE=$BLAS_CORE when BLAS_CORE is set (e.g. SkylakeX where
#   OpenBLAS would pick narrower kernels). CPU_BENCH_ARGS replaces its default arguments. Then
#   `actorpipe-bench processes --no-training` at tiny and small: the engine's own cost per
#   microbatch across 2 processes on that host.
set -u -o pipefail
cd "$(dirname "$0")"
bundle=$PWD
results=${OUT:-$PWD/results}
budget=${BUDGET:-480}
device=${DEVICE:-cuda}
work=$(mktemp -d)
libs=$work/libs
mkdir -p "$results" "$libs"
: >"$results/summary.txt"
: >"$results/log.txt"
tar xJf libs.tar.xz -C "$libs"
# CUDA's runtime, cuBLAS and NCCL from wherever this machine keeps them
for n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  p=$(find /usr/local /opt /usr/lib -name "$n" 2>/dev/null | head -1)
  echo "$n -> ${p:-not found}" >>"$results/log.txt"
  [[ -n "$p" ]] && ln -sf "$p" "$libs/$n"
done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPENBLAS_NUM_THREADS=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.free --format=csv
  grep -m1 "model name" /proc/cpuinfo
  grep -o -w -m1 -E "avx512_bf16|amx_bf16" /proc/cpuinfo | sort -u | tr '\n' ' '
  echo
} >>"$results/log.txt" 2>&1
status=0

# check NAME LIMIT COMMAND...: runs COMMAND under timeout LIMIT in $work, its output into the log
check() {
  local name=$1 limit=$2
  shift 2
  if ((SECONDS + limit > budget)); then
    printf '%-44s not run (time: %ds of %ds used)\n' "$name" "$SECONDS" "$budget" |
      tee -a "$results/summary.txt"
    return
  fi
  local t0=$SECONDS rc
  echo "===== $name: $*" >>"$results/log.txt"
  # bash -c: COMMAND may be one of the functions below (exported)
  (cd "$work" && timeout "$limit" bash -c '"$@"' _ "$@") >"$work/$name.out" 2>&1
  rc=$?
  cat "$work/$name.out" >>"$results/log.txt"
  local verdict=passed
  if ((rc != 0)); then
    verdict="FAILED (exit $rc)"
    status=1
  elif grep -q "SKIPPED: " "$work/$name.out"; then
    verdict="passed, some cases skipped: $(grep -m1 -o "SKIPPED: .*" "$work/$name.out")"
  fi
  printf '%-44s %s (%ds)\n' "$name" "$verdict" $((SECONDS - t0)) | tee -a "$results/summary.txt"
}

# expect_fail NAME PATTERN COMMAND...: COMMAND must exit 1 with PATTERN (grep -E) in its output
expect_fail() {
  local name=$1 pattern=$2
  shift 2
  "$@" >"$work/$name.raw" 2>&1
  local rc=$?
  cat "$work/$name.raw"
  ((rc == 1)) && grep -q -E "$pattern" "$work/$name.raw"
}

# losses_follow A B RTOL: the step losses of two metrics files (JSON lines) agree within RTOL
losses_follow() {
  python3 - "$@" <<'EOF'
import json, sys
def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"step"' in l and '"loss"' in l]
a, b, rtol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a else 0.0
print(f"{len(a)} steps against {len(b)}; worst relative difference {worst:.3e} (limit {rtol})")
print("first losses", a[:3], b[:3], "last", a[-1:], b[-1:])
sys.exit(0 if a and len(a) == len(b) and worst <= rtol else 1)
EOF
}

gpt_vs_cpu() {
  local common=(--set pipeline.stages=2 --set train.steps=30 --set train.log_every=10)
  "$bundle/bin/actorpipe-gpt" "${common[@]}" --set pipeline.device="$device" \
    --set checkpoint.dir=gpt-device --set train.metrics=device.jsonl || return 1
  "$bundle/bin/actorpipe-gpt" "${common[@]}" --set pipeline.device=cpu \
    --set checkpoint.dir=gpt-cpu --set train.metrics=cpu.jsonl || return 1
  losses_follow device.jsonl cpu.jsonl 1e-3
}

small_run() {  # STAGES: the trainer at the bench's small shape on the GPU
  "$bundle/bin/actorpipe-gpt" --set model.vocab_size=8192 --set model.context=256 \
    --set model.width=384 --set model.heads=6 --set model.depth=6 \
    --set pipeline.microbatch_size=8 --set pipeline.microbatches=4 --set pipeline.stages="$1" \
    --set pipeline.device="$device" --set train.steps=40 --set train.log_every=10 \
    --set checkpoint.dir="small-d$1"
}

# The ranks of a job on this machine share its GPU. NCCL refuses a communicator whose two ranks
# are on one GPU of one host, so each rank is told it is a host of its own (NCCL_HOSTID): NCCL
# then connects them through its network transport, sockets on loopback. One process (no
# ACTORPIPE_RANK) is left alone. NCCL_DEBUG=VERSION makes every process that uses NCCL say so.
cat >"$work/ranks_apart.sh" <<EOF
#!/usr/bin/env bash
[[ -n \${ACTORPIPE_RANK:-} ]] && export NCCL_HOSTID=actorpipe-rank-\$ACTORPIPE_RANK
export NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=\${NCCL_DEBUG:-VERSION}
# shellcheck disable=SC2086
exec "$bundle/bin/actorpipe-gpt" "\$@" \${GPT_EXTRA:-}
EOF
chmod +x "$work/ranks_apart.sh"

# same_bits CHANNEL MODE [MOVES]: 2 processes against 1, every stage on the GPU, the activations
# and gradients between the processes over CHANNEL (cluster.gpu_channel); on a GPU, the 2
# processes' output must show NCCL in use for nccl and not for ucx
same_bits() {
  local small="--set|model.vocab_size=32|--set|model.context=16|--set|model.width=32|--set|model.heads=2|--set|model.depth=4|--set|pipeline.microbatch_size=2|--set|pipeline.microbatches=4|--set|train.steps=4|--set|checkpoint.every=2"
  cmake "-DPROGRAM=$work/ranks_apart.sh" "-DLAUNCH=$bundle/bin/actorpipe-launch" -DWORLD=2 \
    "-DARGS=$small|--set|pipeline.mode=$2|--set|pipeline.stages=2|--set|pipeline.device=$device|--set|cluster.gpu_channel=$1" \
    "-DMOVES=${3:-}" "-DWORKDIR=$work/same-bits-$1-$2" -P "$bundle/multiprocess/same_bits.cmake" \
    >"$work/same-bits-$1-$2.txt" 2>&1
  local rc=$?
  cat "$work/same-bits-$1-$2.txt"
  ((rc == 0)) || return $rc
  [[ $device == cuda ]] || return 0
  local used=0
  grep -q "NCCL version" "$work/same-bits-$1-$2.txt" && used=1
  echo "NCCL in use: $used"
  [[ $1 == nccl ]] && ((used == 1)) && return 0
  [[ $1 == ucx ]] && ((used == 0)) && return 0
  return 1
}

# launch_small CHANNEL: 2 processes, a stage each, at the bench's small shape: tokens per second
launch_small() {
  "$bundle/bin/actorpipe-launch" -n 2 --grace 5 -- "$work/ranks_apart.sh" \
    --set model.vocab_size=8192 --set model.context=256 --set model.width=384 \
    --set model.heads=6 --set model.depth=6 --set pipeline.microbatch_size=8 \
    --set pipeline.microbatches=4 --set pipeline.stages=2 --set pipeline.device="$device" \
    --set cluster.gpu_channel="$1" --set train.steps=40 --set train.log_every=10 \
    --set checkpoint.dir="launch-$1"
}

export bundle work device
export -f expect_fail losses_follow gpt_vs_cpu small_run same_bits launch_small
for t in $(cat tests.txt); do
  check "$t" 90 "$bundle/bin/$t"
done
check gpt.device_vs_cpu 90 gpt_vs_cpu
if [[ $device == cuda ]]; then
  check multiprocess.nccl.1f1b 90 same_bits nccl 1f1b
  check multiprocess.nccl.xpipe 90 same_bits nccl xpipe
  check multiprocess.nccl.migration.2bw 90 same_bits nccl 2bw "1: 1, 5/ 3: 5, 1"
fi
check multiprocess.ucx.1f1b 60 same_bits ucx 1f1b
[[ $device == cuda ]] || check multiprocess.ucx.xpipe 60 same_bits ucx xpipe
check multiprocess.ucx.migration.2bw 60 same_bits ucx 2bw "1: 1, 5/ 3: 5, 1"
# needs the checkpoint of gpt.device_vs_cpu
if [[ -d $work/gpt-device/final ]]; then
  check gpt.sample 60 "$bundle/bin/actorpipe-gpt" --sample --checkpoint gpt-device --tokens 20 \
    --seed 4 --top-k 5 --set pipeline.device="$device"
else
  printf '%-44s not run (gpt.device_vs_cpu wrote no checkpoint)\n' gpt.sample |
    tee -a "$results/summary.txt"
  status=1
fi
too_large="of memory is available"
[[ $device == cuda ]] && too_large="on cuda:0 .*need at least .* is free there"
check gpt.too_large 60 expect_fail too_large "$too_large" "$bundle/bin/actorpipe-gpt" \
  --set pipeline.device="$device" --set model.width=1000000 --set train.steps=1
# needs_gpu NAME: true, with a line in the summary, where the runs are not on a GPU
needs_gpu() {
  [[ $device == cuda ]] && return 1
  printf '%-44s not run (DEVICE=%s: needs a GPU)\n' "$1" "$device" | tee -a "$results/summary.txt"
}

# the restart oracle (tests/multiprocess/kill_restart.sh) over NCCL: a rank killed twice and
# relaunched alone; the survivor's links are aborted, every rank makes new ones, and the final
# checkpoint is the uninterrupted job's byte for byte
kill_restart() {
  GPT_EXTRA="--set pipeline.device=cuda" sh "$bundle/multiprocess/kill_restart.sh" \
    "$work/ranks_apart.sh" "$bundle/bin/actorpipe-launch" "$work/kill-restart" 1f1b 2 2 7 dead
}
export -f kill_restart
needs_gpu multiprocess.nccl.kill_restart || check multiprocess.nccl.kill_restart 150 kill_restart

sanitizer=$(command -v compute-sanitizer ||
  find /usr/local /opt -name compute-sanitizer -type f -perm -u+x 2>/dev/null | head -1)
memcheck=("${sanitizer:-compute-sanitizer}" --tool memcheck --error-exitcode 9)
needs_gpu memcheck.pipeline ||
  check memcheck.pipeline 90 "${memcheck[@]}" "$bundle/bin/test_tests_cuda_pipeline" \
    "--test-case=two runs*"
needs_gpu memcheck.trainer ||
  check memcheck.trainer 90 "${memcheck[@]}" "$bundle/bin/test_tests_cuda_trainer" \
    "--test-case=two runs*"
needs_gpu bench.small.fp32 ||
  check bench.small.fp32 60 "$bundle/bin/actorpipe-bench-device" --backend cuda --shape small \
    --precision fp32 --reps 10 --warmup 3
needs_gpu gpt.small.d1 || check gpt.small.d1 60 small_run 1
needs_gpu gpt.small.d2 || check gpt.small.d2 60 small_run 2
needs_gpu gpt.small.launch2.nccl || check gpt.small.launch2.nccl 90 launch_small nccl
needs_gpu gpt.small.launch2.ucx || check gpt.small.launch2.ucx 90 launch_small ucx
if [[ -x $bundle/bin/actorpipe-bench-cpu && $device == cuda ]]; then
  cpu_bench() {
    lscpu | grep -E "^(Model name|Thread|Core|Socket|NUMA node|CPU\(s\))"
    [[ -n ${BLAS_CORE:-} ]] && export OPENBLAS_CORETYPE=$BLAS_CORE
    # shellcheck disable=SC2086
    "$bundle/bin/actorpipe-bench-cpu" ${CPU_BENCH_ARGS:---shapes small --threads 1,2 --reps 3} \
      --python "$(command -v python3)" --peer-script "$bundle/peers/torch_step.py"
  }
  export -f cpu_bench
  check cpu_bench.$(cat cpu_march.txt) 300 cpu_bench
  # the engine's own cost per microbatch across 2 processes (no compute), on a host with cores
  # to spare (docs/benchmarks.md, "Several processes")
  processes_bench() {
    lscpu | grep -E "^(Model name|CPU\(s\))"
    "$bundle/bin/actorpipe-bench-cpu" processes --shape "$1" --no-training --repeats "$2"
  }
  export -f processes_bench
  check processes.tiny 100 processes_bench tiny 5
  check processes.small 100 processes_bench small 3
fi
rm -rf "$work"
echo "status $status after ${SECONDS}s" | tee -a "$results/summary.txt"
exit "$status"
