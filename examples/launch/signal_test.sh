# A signal sent to actorpipe-launch reaches every rank: starts two ranks that print "ready" and
# catch SIGTERM and SIGINT, sends the launcher SIG (TERM or INT) once both are ready, and checks
# that both ranks saw it, that the launcher said so and exited 0.
# usage: sh signal_test.sh LAUNCHER RANK_SCRIPT SIG
launcher=$1
rank_script=$2
sig=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

: >"$dir/out"
: >"$dir/err"
"$launcher" -n 2 --grace 5 -- sh "$rank_script" signals >"$dir/out" 2>"$dir/err" &
pid=$!
fail() {
  echo "FAILED: $1"
  kill -KILL "$pid" 2>/dev/null  # the ranks die with it (parent-death signal)
  echo "--- stdout"; cat "$dir/out"; echo "--- stderr"; cat "$dir/err"
  exit 1
}
i=0
while [ "$(grep -c '^\[rank [01]\] ready$' "$dir/out" || true)" -lt 2 ]; do
  i=$((i + 1))
  [ $i -le 200 ] || fail "the ranks are not ready after 20 s"
  sleep 0.1
done
kill -"$sig" "$pid"
wait "$pid"
code=$?
echo "--- stdout"; cat "$dir/out"; echo "--- stderr"; cat "$dir/err"
[ "$code" -eq 0 ] || fail "the launcher exited with $code, expected 0"
grep -q "^\[rank 0\] rank 0 got $sig\$" "$dir/out" || fail "rank 0 did not get SIG$sig"
grep -q "^\[rank 1\] rank 1 got $sig\$" "$dir/out" || fail "rank 1 did not get SIG$sig"
grep -q "^actorpipe-launch: received SIG$sig; forwarding it to ranks 0, 1\$" "$dir/err" ||
  fail "the launcher did not say it forwarded SIG$sig"
echo "SIG$sig reached both ranks"
