# Smoke test of `actorpipe-bench migration`: the tiny shape, 1f1b, the "bad" scenario, one
# repeat; the command must exit 0 and print one JSON line per scenario with step times > 0, the
# partition it started from ([1, 3]) and a final partition per run.
# Usage: cmake -DBENCH=<path to actorpipe-bench> -P migration_smoke_test.cmake
if(NOT BENCH)
  message(FATAL_ERROR "pass -DBENCH=<path to actorpipe-bench>")
endif()
execute_process(
  COMMAND ${BENCH} migration --shape tiny --modes 1f1b --scenarios bad,slow --microbatches 2
          --steps 8 --check-every 2 --slow-from 2 --repeats 1 --json
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 280)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "actorpipe-bench migration exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
endif()
string(STRIP "${out}" out)
string(REPLACE ";" "," out "${out}")
string(REPLACE "\n" ";" lines "${out}")
set(n 0)
foreach(line IN LISTS lines)
  string(JSON name ERROR_VARIABLE jerr GET "${line}" name)
  if(jerr OR NOT name STREQUAL "migration")
    message(FATAL_ERROR "not a migration line: ${jerr}\n${line}")
  endif()
  math(EXPR n "${n} + 1")
  string(JSON before GET "${line}" step_seconds_before)
  if(NOT before GREATER 0)
    message(FATAL_ERROR "no step time before the move:\n${line}")
  endif()
  string(JSON finals LENGTH "${line}" finals)
  if(NOT finals EQUAL 1)
    message(FATAL_ERROR "expected the final partition of 1 run:\n${line}")
  endif()
endforeach()
if(NOT n EQUAL 2)
  message(FATAL_ERROR "expected 2 lines (bad, slow), got ${n}:\n${out}")
endif()
