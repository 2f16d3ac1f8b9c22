#!/bin/sh
# One ucx_perftest measurement between two processes on 127.0.0.1: a server in the background and
# a client, which prints the result (its "Final:" line). Usage: ucx_perftest_pair.sh PORT ARGS...
# The client is retried (10 times at most) until the server listens; both end within 120 s.
set -u
port=$1
shift
timeout 120 ucx_perftest -p "$port" "$@" >/dev/null 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null' EXIT
out=""
for try in 1 2 3 4 5 6 7 8 9 10; do
  sleep 0.2
  if out=$(timeout 120 ucx_perftest 127.0.0.1 -p "$port" "$@" 2>&1); then
    printf '%s\n' "$out"
    wait "$server"
    exit 0
  fi
done
printf 'ucx_perftest client failed %s times; last output:\n%s\n' "$try" "$out" >&2
exit 1
