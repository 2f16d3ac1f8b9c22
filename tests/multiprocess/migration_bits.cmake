# The automatic migration oracle across processes: runs PROGRAM as WORLD processes under LAUNCH
# with ARGS ('|'-separated, migration.enabled among them), requires the manager to have moved
# layers at least once, reads every move (step and layer counts) from the job's metrics, runs
# one process with the same moves forced (migration.moves) and the manager off, and requires
# the same bits (compare_runs.cmake: checkpoints, losses, the moves). FROM, when set, is the
# partition the job starts with ("1,7"), which it must not end with. WORKDIR is made fresh.
include(${CMAKE_CURRENT_LIST_DIR}/compare_runs.cmake)
actorpipe_fresh_runs()
execute_process(COMMAND "${LAUNCH}" -n ${WORLD} --grace 5 -- "${PROGRAM}" ${common}
  WORKING_DIRECTORY "${WORKDIR}/multi"
  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
message("${out}${err}")
if(NOT code EQUAL 0)
  message(FATAL_ERROR "${WORLD} processes: exit ${code}")
endif()
file(STRINGS "${WORKDIR}/multi/metrics.jsonl" lines)
set(moves "")
set(last "")
foreach(line IN LISTS lines)
  string(JSON migration ERROR_VARIABLE no_migration GET "${line}" migration)
  if(no_migration)
    continue()
  endif()
  string(JSON moved GET "${migration}" moved)
  if(NOT (moved STREQUAL "ON" OR moved STREQUAL "true"))
    continue()
  endif()
  string(JSON step GET "${migration}" step)
  string(JSON to GET "${migration}" to)
  string(REGEX REPLACE "[][ \n]" "" last "${to}")
  string(REPLACE "," ", " counts "${last}")
  if(moves STREQUAL "")
    set(moves "${step}: ${counts}")
  else()
    set(moves "${moves}\\; ${step}: ${counts}")
  endif()
endforeach()
if(moves STREQUAL "")
  message(FATAL_ERROR "the migration manager moved nothing")
endif()
if(DEFINED FROM AND last STREQUAL FROM)
  message(FATAL_ERROR "the job ended with the partition it started with, [${last}]")
endif()
message("the job's moves: ${moves}")
string(REPLACE "\\;" ";" forced "${moves}")
execute_process(COMMAND "${PROGRAM}" ${common} --set migration.enabled=false
  "--set=migration.moves=${forced}" WORKING_DIRECTORY "${WORKDIR}/one"
  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "one process with the moves forced: exit ${code}\n${out}${err}")
endif()
actorpipe_compare_runs("${WORKDIR}" "${WORLD} processes" MOVES_ONLY)
message("same bits as the moves forced in one process: ${COMPARED}")
