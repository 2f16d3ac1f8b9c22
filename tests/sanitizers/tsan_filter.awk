# Judges ThreadSanitizer report files (TSAN_OPTIONS=log_path=...): the project's only TSan
# "suppression". Used by tsan_run.sh; its rules are tested by tsan_filter.test.sh.
#
#   awk -f tsan_filter.awk report.PID...      exit 0: every report forgiven; 1: some report is ours
#
# A report (WARNING: ThreadSanitizer: ... up to its SUMMARY line) is forgiven only when every
# frame of every stack that judges it lies in libcaf: CAF's code, compiled into libcaf_*.so* or,
# for its header templates, into our binaries (a frame whose source file is under include/caf/):
#   - the stacks that judge a report are its access stacks (the read, the write, the previous
#     access, the mutex acquisitions); the context stacks ("Location is ... allocated",
#     "Mutex ... created at", "Thread ... created by") say where things came from and do not
#     judge, unless a report has nothing else (a thread leak): then all its stacks judge;
#   - frames of the C and C++ runtimes and of TSan itself (libc, libstdc++, libgcc_s, ld-linux,
#     libtsan, and the standard library's templates wherever they were compiled: a source file
#     under include/c++/) are neutral: libcaf calls them, and every thread starts in libc;
#   - any other frame (our code, UCX, OpenBLAS, a frame without a module) makes the report ours;
#   - a report whose judging frames are all neutral is ours too (nothing shows it is libcaf's).
# Forgiven reports are counted and named by their SUMMARY line; ours are printed whole. Text
# outside reports is printed; a FATAL or CHECK failed line from TSan fails the run.

function reset_report() {
  in_report = 1; text = ""; summary = ""; report_file = FILENAME
  judged_caf = 0; judged_other = 0; context_caf = 0; context_other = 0; section = "access"
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
  in_report = 0
  caf = judged_caf; other = judged_other
  if (caf + other == 0) { caf = context_caf; other = context_other }
  if (other == 0 && caf > 0) {
    forgiven++
    if (summary == "") summary = "(no SUMMARY line)"
    printf "tsan: forgiven, every frame in libcaf: %s [%s]\n", summary, report_file
  } else {
    ours++
    printf "%s", text
    printf "tsan: the report above is not libcaf's alone: FAIL [%s]\n", report_file
  }
}

BEGIN { forgiven = 0; ours = 0; fatal = 0; in_report = 0 }

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
      section = "context"
    else
      section = "access"
    next
  }
  if ($0 ~ /^    #[0-9]+ /) {
    mod = module_of($0)
    file = $(NF - 1)  # the source file:line before the module, or <null>
    if (mod ~ /^libcaf_[a-z_]+\.so/ || file ~ /\/include\/caf\//) kind = "caf"
    else if (mod ~ /^(libc\.so|libstdc\+\+\.so|libgcc_s\.so|ld-linux|libtsan\.so)/ ||
             file ~ /\/include\/c\+\+\//) kind = "neutral"
    else kind = "other"
    if (kind == "neutral") next
    if (section == "access") { if (kind == "caf") judged_caf++; else judged_other++ }
    else { if (kind == "caf") context_caf++; else context_other++ }
  }
}

END {
  if (in_report) end_report()
  if (forgiven + ours > 0)
    printf "tsan: %d report(s) forgiven (libcaf only), %d report(s) ours\n", forgiven, ours
  exit (ours > 0 || fatal > 0) ? 1 : 0
}
