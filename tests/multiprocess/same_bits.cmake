# The multi-process oracle: runs PROGRAM (actorpipe-gpt or actorpipe-bert) once in one process and
# once as WORLD processes under LAUNCH (actorpipe-launch, or Open MPI's mpirun when MPIRUN is set)
# with the same ARGS ("|"-separated) and MOVES (migration.moves, '/' for ';'), then
# requires the same bits (and, with EXPECT, output of the job that matches it) (compare_runs.cmake: every checkpoint file, every loss and migration
# verdict in the metrics). WORKDIR is made fresh.
include(${CMAKE_CURRENT_LIST_DIR}/compare_runs.cmake)
actorpipe_fresh_runs()

string(REPLACE "|" ";" one_args "${ONE_ARGS}")
# MOVES: migration.moves with '/' for its ';' (a CMake list separator), passed as one argument
string(REPLACE "/" ";" moves "${MOVES}")
execute_process(COMMAND "${PROGRAM}" ${common} ${one_args} --set "migration.moves=${moves}"
  WORKING_DIRECTORY "${WORKDIR}/one"
  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "one process: exit ${code}\n${out}${err}")
endif()
if(MPIRUN)
  # mpirun gives ranks (OMPI_COMM_WORLD_*); the coordinator and the secret come from the
  # environment it passes on
  string(RANDOM LENGTH 4 ALPHABET 0123456789 r)
  math(EXPR port "20000 + ${r} % 10000")
  set(ENV{ACTORPIPE_COORDINATOR} "127.0.0.1:${port}")
  string(RANDOM LENGTH 40 secret)
  set(ENV{ACTORPIPE_JOB_SECRET} "${secret}")
  set(launch "${MPIRUN}" --allow-run-as-root --oversubscribe -np ${WORLD}
    -x ACTORPIPE_COORDINATOR -x ACTORPIPE_JOB_SECRET -x OPENBLAS_NUM_THREADS)
else()
  set(launch "${LAUNCH}" -n ${WORLD} --grace 5 --)
endif()
execute_process(COMMAND ${launch} "${PROGRAM}" ${common} --set "migration.moves=${moves}"
  WORKING_DIRECTORY "${WORKDIR}/multi"
  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
message("${out}${err}")
if(NOT code EQUAL 0)
  message(FATAL_ERROR "${WORLD} processes: exit ${code}")
endif()
# EXPECT: a regular expression the job's output must match (how its tensors went, say)
if(EXPECT AND NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "${WORLD} processes: the output does not match \"${EXPECT}\"")
endif()

actorpipe_compare_runs("${WORKDIR}" "${WORLD} processes")
message("same bits: ${COMPARED}")
