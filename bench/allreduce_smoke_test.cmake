# Smoke test of `actorpipe-bench allreduce --quick`: two ranks time GlooGroup::all_reduce_sum of
# 64 KiB and 1 MiB (one round, 5 calls, each size's result checked against the serial sum inside
# the ranks) and ucx_perftest tag_bw over tcp runs the same sizes. The command must exit 0 and
# print both tables: one row of medians per size with our figures and ucx_perftest's beside them,
# and one row per size and round. Without ucx_perftest (package ucx-utils) the test says
# "skipped:" (SKIP_REGULAR_EXPRESSION) instead of passing on our figures alone.
# Usage: cmake -DBENCH=<path to actorpipe-bench> -P allreduce_smoke_test.cmake
if(NOT BENCH)
  message(FATAL_ERROR "pass -DBENCH=<path to actorpipe-bench>")
endif()
find_program(PERFTEST ucx_perftest)
if(NOT PERFTEST)
  message("skipped: ucx_perftest not found (package ucx-utils): the all-reduce bench needs its peer")
  return()
endif()
execute_process(
  COMMAND ${BENCH} allreduce --quick
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "actorpipe-bench allreduce --quick exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
endif()
set(gbs "[0-9]+\\.[0-9][0-9] GB/s")
# medians: size, calls, ours ms, ours alg, ours bus, perftest, ratio
foreach(size "64 KiB" "1 MiB")
  if(NOT out MATCHES "\n${size} +5 +[0-9]+\\.[0-9]+ +${gbs} +${gbs} +${gbs} +[0-9]+% ")
    message(FATAL_ERROR "no row of medians with ucx_perftest's figure for ${size}:\n${out}\nstderr:\n${err}")
  endif()
  # each round: size, round, ours ms, ours bus, perftest, ratio
  if(NOT out MATCHES "\n${size} +1 +[0-9]+\\.[0-9]+ +${gbs} +${gbs} +[0-9]+%\n")
    message(FATAL_ERROR "no row of round 1 for ${size}:\n${out}\nstderr:\n${err}")
  endif()
endforeach()
foreach(heading "medians over 1 round:" "each round:")
  string(FIND "${out}" "${heading}" at)
  if(at LESS 0)
    message(FATAL_ERROR "no '${heading}' table:\n${out}")
  endif()
endforeach()
message(STATUS "allreduce bench smoke: both tables, 2 sizes with ucx_perftest beside them")
