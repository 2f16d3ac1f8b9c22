# Judges ThreadSanitizer report files (TSAN_OPTIONS=log_path=...): the project's only TSan
# "suppression". Used by tsan_run.sh; its rules are tested by tsan_filter.test.sh.
#
#   awk -f tsan_filter.awk report.PID...      exit 0: every report forgiven; 1: some report is ours
#
# A report (WARNING: ThreadSanitizer: ... up to its SUMMARY line) is forgiven only when every
# stack that judges it shows an access made by libcaf's own code: its innermost frame that is
# not runtime code lies in libcaf (CAF's code, compiled into libcaf_*.so* or, for its header
# templates, into our binaries: a frame whose source file is under include/caf/). The frames
# further out are the callers and do not matter: a main thread that tears an actor system down
# calls libcaf from our code, and every actor's handler is called by libcaf's scheduler.
#   - the stacks that judge a report are its access stacks (the read, the write, the previous
#     access, the mutex acquisitions); the context stacks ("Location is ... allocated",
#     "Mutex ... created at", "Thread ... created by") say where things came from and do not
#     judge, unless a report has nothing else (a thread leak): then all its stacks judge;
#   - frames of the C and C++ runtimes and of TSan itself (libc, libstdc++, libgcc_s, ld-linux,
#     libtsan, and the standard library's templates wherever they were compiled: a source file
#     under include/c++/) are runtime code, passed over: libcaf calls them, and every thread
#     starts in libc;
#   - a stack whose innermost other frame is not libcaf's (our code, UCX, OpenBLAS, a frame
#     without a module), or that has no other frame, makes the report ours.
# Forgiven reports are counted and named by their SUMMARY line; ours are printed whole. Text
# outside reports is printed; a FATAL or CHECK failed line from TSan fails the run.

function reset_report() {
  in_report = 1; text = ""; summary = ""; report_file = FILENAME
  judged_caf = 0; judged_other = 0; context_caf = 0; context_other = 0
  start_stack("access")
}
# a stack begins: its first frame that is not runtime code says who made the access
function start_stack(kind) {
  end_stack()
  section = kind; stack_open = 1; innermost = ""; frames = 0
}
# a stack ends: counted by its innermost frame that is not runtime code ("other" when none)
function end_stack() {
  if (!stack_open) return
  stack_open = 0
  if (!frames) return
  if (innermost == "") innermost = "other"
  if (section == "access") { if (innermost == "caf") judged_caf++; else judged_other++ }
  else { if (innermost == "caf") context_caf++; else context_other++ }
  frames = 0
}
function module_of(line,    m) {
  # the last parenthesised word: (libcaf_core.so.0.17.6+0x1234) or (test_x+0x10)
  if (match(line, /\([^()]*\+0x[0-9a-f]+\)[ \t]*$/)) {
    m = substr(line, RSTART + 1, RLENGTH - 2)
    sub(/\+0x[0-9a-f]+$/, "", m)
    return m
  }
  return ""
}
function end_report(    caf, other) {
  end_stack()
  in_report = 0
  caf = judged_caf; other = judged_other
  if (caf + other == 0) { caf = context_caf; other = context_other }
  if (other == 0 && caf > 0) {
    forgiven++
    if (summary == "") summary = "(no SUMMARY line)"
    printf "tsan: forgiven, every access made by libcaf: %s [%s]\n", summary, report_file
  } else {
    ours++
    printf "%s", text
    printf "tsan: the report above is not libcaf's alone: FAIL [%s]\n", report_file
  }
}

BEGIN { forgiven = 0; ours = 0; fatal = 0; in_report = 0; stack_open = 0; frames = 0 }

FNR == 1 && in_report { end_report() }

/^WARNING: ThreadSanitizer: / {
  if (in_report) end_report()
  reset_report()
}

{
  if (!in_report) {
    if ($0 !~ /^=+$/ && $0 != "") print
    if ($0 ~ /FATAL|CHECK failed/) fatal++
    next
  }
  text = text $0 "\n"
  if ($0 ~ /^SUMMARY: ThreadSanitizer: /) {
    summary = substr($0, 10)
    end_report()
    next
  }
  if ($0 ~ /^  [^ ]/) {
    # a section header: which kind of stack follows
    if ($0 ~ /^  Location is / || $0 ~ /^  As if synchronized via sleep/ ||
        $0 ~ /^  Mutex M[0-9]+ .*created at:/ ||
        $0 ~ /^  Thread T[0-9]+ .*created by /)
      start_stack("context")
    else
      start_stack("access")
    next
  }
  if ($0 ~ /^    #[0-9]+ /) {
    frames++
    if (innermost != "") next
    mod = module_of($0)
    file = $(NF - 1)  # the source file:line before the module, or <null>
    if (mod ~ /^libcaf_[a-z_]+\.so/ || file ~ /\/include\/caf\//) innermost = "caf"
    else if (mod ~ /^(libc\.so|libstdc\+\+\.so|libgcc_s\.so|ld-linux|libtsan\.so)/ ||
             file ~ /\/include\/c\+\+\//) next
    else innermost = "other"
  }
}

END {
  if (in_report) end_report()
  if (forgiven + ours > 0)
    printf "tsan: %d report(s) forgiven (libcaf only), %d report(s) ours\n", forgiven, ours
  exit (ours > 0 || fatal > 0) ? 1 : 0
}
