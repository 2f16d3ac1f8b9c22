#!/usr/bin/env bash
# tests.sanitizers.racy_actor (ThreadSanitizer build only): the deliberate race of
# racy_actor.cpp must fail its run through tsan_run.sh, with the racing function named, while a
# TSan suppression `race:libcaf_core` would have hidden it (which is why tsan_filter.awk judges
# whole reports instead).
# Both runs preload caf_happens_before: its annotations must not hide a race of ours either.
#   racy_actor_test.sh PATH-TO-tsan_racy_actor PATH-TO-libactorpipe_caf_happens_before.so
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
racy=$1
preload=$2
fail() { echo "racy_actor_test: FAIL: $*" >&2; exit 1; }

out=$("$here/tsan_run.sh" --preload "$preload" "$racy" 2>&1)
rc=$?
echo "$out"
((rc == 66)) || fail "tsan_run.sh exited $rc, expected 66 (the program passes; its race fails it)"
grep -q "racy_write_in_actor" <<<"$out" || fail "the report does not name racy_write_in_actor"
grep -q "racy_write_in_main" <<<"$out" || fail "the report does not name racy_write_in_main"
grep -q "not libcaf's alone: FAIL" <<<"$out" || fail "the filter did not judge the report ours"

supp=$(mktemp)
trap 'rm -f "$supp"' EXIT
echo "race:libcaf_core" >"$supp"
out=$(TSAN_OPTIONS="suppressions=$supp" "$here/tsan_run.sh" --preload "$preload" "$racy" 2>&1)
rc=$?
((rc == 0)) || { echo "$out"; fail "with race:libcaf_core suppressed, expected the race hidden (exit 0), got $rc"; }
echo "racy_actor_test: caught by the filter; a race:libcaf_core suppression would have hidden it"
