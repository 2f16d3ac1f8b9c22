# Smoke test of actorpipe-bench: one tiny configuration without the peer must exit 0 and
# print exactly one JSON line with the documented fields and sane values.
# Usage: cmake -DBENCH=<path to actorpipe-bench> -P smoke_test.cmake
if(NOT BENCH)
  message(FATAL_ERROR "pass -DBENCH=<path to actorpipe-bench>")
endif()
execute_process(
  COMMAND ${BENCH} --shapes tiny --threads 1 --reps 1 --no-peer --json
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "actorpipe-bench exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
endif()
string(STRIP "${out}" out)
string(REPLACE "\n" ";" lines "${out}")
list(LENGTH lines n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "expected exactly one JSON line, got ${n}:\n${out}")
endif()
foreach(key name shape threads tokens_per_s gflops peak_rss_mb peer_tokens_per_s ratio
        floor_ratio)
  string(JSON type ERROR_VARIABLE jerr TYPE "${out}" ${key})
  if(jerr)
    message(FATAL_ERROR "field '${key}' missing: ${jerr}\n${out}")
  endif()
endforeach()
string(JSON name GET "${out}" name)
string(JSON shape GET "${out}" shape)
string(JSON threads GET "${out}" threads)
string(JSON peer TYPE "${out}" peer_tokens_per_s)
string(JSON floor_type TYPE "${out}" floor_ratio)
if(NOT name STREQUAL "reference_trainer_step" OR NOT shape STREQUAL "tiny" OR
   NOT threads EQUAL 1 OR NOT peer STREQUAL "NULL" OR NOT floor_type STREQUAL "NUMBER")
  message(FATAL_ERROR "unexpected values (name ${name}, shape ${shape}, threads ${threads}, "
                      "peer ${peer}, floor_ratio ${floor_type}):\n${out}")
endif()
foreach(key tokens_per_s gflops peak_rss_mb floor_ratio)
  string(JSON v GET "${out}" ${key})
  if(NOT v GREATER 0)
    message(FATAL_ERROR "${key} = ${v}, expected > 0:\n${out}")
  endif()
endforeach()
message(STATUS "actorpipe-bench smoke: ${out}")
