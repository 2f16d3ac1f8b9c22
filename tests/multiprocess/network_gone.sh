#!/usr/bin/env bash
# A network that goes away mid-run (no FIN, no RST: the veth link between two network namespaces
# is taken down): both ranks must stop within a bound (cluster.peer_timeout + 8 s; the heartbeats
# of the control connections), each naming the lost rank, and the last checkpoint must load and
# resume. Reports a skip (exit 77) without CAP_NET_ADMIN.
# Usage: network_gone.sh PROGRAM WORKDIR [--set k=v ...]
set -euo pipefail
program=$1
work=$2
shift 2
args=("$@")

source "$(dirname "$0")/two_netns.sh" n

rm -rf "$work"
mkdir -p "$work"
port=$((20000 + RANDOM % 10000))
export ACTORPIPE_JOB_SECRET=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
export UCX_TLS=tcp
peer_timeout=${PEER_TIMEOUT:-3}
run_rank() {  # rank namespace device
  (cd "$work" && exec ip netns exec "$2" env UCX_NET_DEVICES="$3" "$program" \
    --rank "$1" --world 2 --coordinator "${net}1:$port" "${args[@]}" \
    --set cluster.bind="${net}1" --set cluster.peer_timeout=$peer_timeout \
    --set train.steps=100000 --set checkpoint.dir=ckpt --set checkpoint.every=25 \
    --set train.log_every=0 > "rank$1.log" 2>&1) &
  pids+=($!)
}
run_rank 0 "$nsA" "$devA"
run_rank 1 "$nsB" "$devB"
for _ in $(seq 600); do
  [[ -f "$work/ckpt/step-50/manifest.json" ]] && break
  sleep 0.1
done
[[ -f "$work/ckpt/step-50/manifest.json" ]] || { cat "$work"/rank*.log; echo "no checkpoint"; exit 1; }
ip -n "$nsB" link set "$devB" down
start=$(date +%s.%N)
# detection takes peer_timeout, rank 0 asks the lost stage for its state (2 s), exit ~1 s
limit=$((peer_timeout + 8))
status=0
for i in 0 1; do
  p=${pids[$i]}
  if ! timeout "$limit" tail --pid="$p" -f /dev/null; then
    echo "rank $i still runs ${limit} s after the link went down: killed"
    kill -KILL "$p" 2>/dev/null || true  # the wait below must not outlive the test's bound
    status=1
  fi
done
took=$(echo "$(date +%s.%N) - $start" | bc)
for i in 0 1; do
  wait "${pids[$i]}" && { echo "rank $i exited 0 after losing its peer"; status=1; } || true
done
pids=()
cat "$work/rank0.log" "$work/rank1.log" | grep -E "error|lost" || true
grep -q "rank 1 was lost" "$work/rank0.log" || { echo "rank 0 does not name rank 1"; status=1; }
grep -q "rank 0 was lost" "$work/rank1.log" || { echo "rank 1 does not name rank 0"; status=1; }
echo "both ranks stopped ${took} s after the link went down (peer_timeout ${peer_timeout} s)"
[[ $status == 0 ]] || exit 1
# the last complete checkpoint loads and continues in one process
k=$(ls "$work/ckpt" | sed -n 's/^step-\([0-9]*\)$/\1/p' | sort -n | tail -1)
(cd "$work" && timeout 300 "$program" "${args[@]}" --set checkpoint.resume=ckpt --set checkpoint.dir=resumed \
  --set train.steps=$((k + 2)) \
  --set train.log_every=0 > resume.log 2>&1) || { cat "$work/resume.log"; exit 1; }
grep -q "resumed from" "$work/resume.log"
echo "resumed from step $k"
