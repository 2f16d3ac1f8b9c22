#!/usr/bin/env bash
# Two hosts on one machine: network namespaces "A" and "B" joined by a veth pair, rank 0 of a
# two-process actorpipe-gpt job in A (its coordinator bound to A's address), rank 1 in B, the
# tensors over UCX TCP across the veth link. The checkpoint files and losses must be the bits of
# the same pipeline in one process. Without CAP_NET_ADMIN it reports a skip (exit 77), never a
# pass. With TLS=1 the control connections use TLS with a CA and a certificate made here for the
# job (openssl). Usage: [TLS=1] two_hosts.sh PROGRAM WORKDIR [--set k=v ...]
set -euo pipefail
program=$1
work=$2
shift 2
args=("$@" --set checkpoint.dir=ckpt --set train.metrics=metrics.jsonl --set train.log_every=0)

source "$(dirname "$0")/two_netns.sh" v

rm -rf "$work"
mkdir -p "$work/one" "$work/multi"
(cd "$work/one" && "$program" "${args[@]}" > out.log 2>&1) || {
  cat "$work/one/out.log"
  echo "the one-process run failed"
  exit 1
}

tls=()
if [[ "${TLS:-0}" == 1 ]]; then
  # a CA and one certificate it signed, for both ranks (openssl, package openssl)
  d="$work/tls"
  mkdir -p "$d"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$d/ca.key" \
    -out "$d/ca.pem" -days 1 -subj /CN=actorpipe-test-ca 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$d/node.key" \
    -out "$d/node.csr" -subj /CN=actorpipe-node 2>/dev/null
  openssl x509 -req -in "$d/node.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -out "$d/node.pem" -days 1 2>/dev/null
  chmod 600 "$d/node.key" "$d/ca.key"
  tls=(--set cluster.tls_certificate="$d/node.pem" --set cluster.tls_key="$d/node.key"
       --set cluster.tls_ca="$d/ca.pem")
fi
port=$((20000 + RANDOM % 10000))
export ACTORPIPE_JOB_SECRET=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
# UCX over TCP only, on the veth link (one namespace per "host": no shared memory between them)
export UCX_TLS=tcp
run_rank() {  # rank namespace device
  (cd "$work/multi" && exec ip netns exec "$2" env UCX_NET_DEVICES="$3" "$program" \
    --rank "$1" --world 2 --coordinator "${net}1:$port" --set cluster.bind="${net}1" \
    --set cluster.connect_timeout=30 "${tls[@]}" "${args[@]}" > "rank$1.log" 2>&1) &
  pids+=($!)
}
run_rank 0 "$nsA" "$devA"
run_rank 1 "$nsB" "$devB"
status=0
for p in "${pids[@]}"; do
  if ! timeout 300 tail --pid="$p" -f /dev/null; then status=1; fi
  wait "$p" || status=1
done
pids=()
cat "$work/multi/rank0.log" "$work/multi/rank1.log"
if [[ $status != 0 ]]; then
  echo "the two-host run failed"
  exit 1
fi
grep -q "cluster: rank 0 of 2" "$work/multi/rank0.log"

cd "$work"
one=$(cd one/ckpt && find . -type f ! -name lock | sort)
multi=$(cd multi/ckpt && find . -type f ! -name lock | sort)
[[ -n $one && "$one" == "$multi" ]] || { echo "checkpoint files differ: $one / $multi"; exit 1; }
for f in $one; do
  cmp -s "one/ckpt/$f" "multi/ckpt/$f" || { echo "$f differs"; exit 1; }
done
losses() { sed -n 's/.*"loss":\([^,]*\),.*/\1/p' "$1"; }
[[ "$(losses one/metrics.jsonl)" == "$(losses multi/metrics.jsonl)" ]] || {
  echo "losses differ"
  exit 1
}
echo "same bits across two network namespaces over UCX TCP${tls:+ with TLS}: $(echo "$one" | wc -l) files"
