#!/usr/bin/env bash
# tests.sanitizers.leaky_actor (AddressSanitizer build only): the leak of leaky_actor.cpp must
# fail its run, naming the function that leaked, although the program carries the project's
# LeakSanitizer suppressions (lsan_suppressions.cpp): they hide libcaf's own cycle, not ours.
#   leaky_actor_test.sh PATH-TO-asan_leaky_actor
set -uo pipefail
leaky=$1
fail() { echo "leaky_actor_test: FAIL: $*" >&2; exit 1; }

out=$(ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=exitcode=23:print_suppressions=0 "$leaky" 2>&1)
rc=$?
echo "$out"
grep -q "leaky_actor: done" <<<"$out" || fail "the program did not run to its end"
((rc == 23)) || fail "exited $rc, expected 23 (LeakSanitizer's report)"
grep -q "LeakSanitizer: detected memory leaks" <<<"$out" || fail "no leak report"
grep -q "leak_a_handle" <<<"$out" || fail "the report does not name leak_a_handle"

# what the project's suppression relies on: a suppressed allocation hides the chunks reachable
# from it (here the actor's behaviour and errors, as the broker's tables behind the broker)
supp=$(mktemp)
trap 'rm -f "$supp"' EXIT
echo "leak:leak_a_handle" >"$supp"
out=$(ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=exitcode=23:suppressions=$supp "$leaky" 2>&1)
rc=$?
((rc == 0)) || { echo "$out"; fail "with the leak's root suppressed, expected no report (exit 0), got $rc"; }
echo "leaky_actor_test: the leak is reported with the project's suppressions in force, and a"
echo "suppressed root hides what only it reaches"
