# A failure that repeats without progress is not restarted again: a job whose config cannot run
# (WORLD processes for a pipeline of fewer stages; one process resuming a checkpoint that is not
# there) under actorpipe-launch --max-restarts 45 must end with exit status 3 (kExitNoRestart)
# within the timeout, a rank saying why it does not start or rejoin again and the launcher why it
# relaunches nobody.
# RELAUNCH=dead (the default): each rank relaunched once and rejoined at most twice (not 45
# times: a rank whose second failure comes after another rank has left counts it as a loss and
# rejoins once more, until the launcher stops it); the rank that sees the repeat lives on.
# RELAUNCH=all: every rank is a new process each time; it finds the failure its predecessor left
# (ACTORPIPE_FAILURE_FILE); at most WORLD restarts of the job (a rank that failed first in one
# attempt has left its record; one that was stopped first has not).
cmake_policy(SET CMP0054 NEW)  # "all" below is a string, not the variable
if(NOT DEFINED RELAUNCH)
  set(RELAUNCH dead)
endif()
file(REMOVE_RECURSE "${WORKDIR}")
file(MAKE_DIRECTORY "${WORKDIR}")
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND "${LAUNCH}" -n ${WORLD} --max-restarts 45 --restart-backoff 0 --grace 5
  --relaunch ${RELAUNCH} -- "${PROGRAM}" ${args}
  WORKING_DIRECTORY "${WORKDIR}" RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err
  TIMEOUT 120)
set(all "${out}${err}")
message("${all}")
if(NOT code EQUAL 3)
  message(FATAL_ERROR "exit ${code}, expected 3 (a restart cannot help)")
endif()
if(RELAUNCH STREQUAL "all" OR WORLD EQUAL 1)
  set(not_again "not starting again")
else()
  set(not_again "not rejoining the job again")
endif()
foreach(expect
    "${FAILURE}"
    "rank [0-9]+: ${not_again}: the same failure as before restart [0-9]+, before any step \\(a restart cannot help"
    "actorpipe-launch: rank [0-9]+ exited with status 3 \\(a restart cannot help, it says: not relaunched\\)")
  if(NOT all MATCHES "${expect}")
    message(FATAL_ERROR "the output does not say: ${expect}")
  endif()
endforeach()
string(REGEX MATCHALL "rejoins the job|relaunching rank|restarting every rank" restarts "${all}")
list(LENGTH restarts n)
if(RELAUNCH STREQUAL "all" OR WORLD EQUAL 1)
  set(bound ${WORLD})
else()
  math(EXPR bound "3 * ${WORLD}")
endif()
if(n GREATER bound)
  message(FATAL_ERROR "${n} relaunches and rejoins for ${WORLD} ranks, expected at most ${bound}")
endif()
message("${n} relaunches and rejoins before the job ended")
