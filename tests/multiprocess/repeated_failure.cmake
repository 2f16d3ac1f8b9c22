# A failure that repeats without progress is not restarted again: a job whose config cannot run
# on its processes (WORLD processes for a pipeline of fewer stages) under actorpipe-launch
# --max-restarts 45 (--relaunch dead) must end with exit status 3 (kExitNoRestart) within the
# timeout, each rank relaunched once and rejoined at most twice (not 45 times: a rank whose
# second failure comes after another rank has left counts it as a loss and rejoins once more,
# until the launcher stops it), a rank saying why it does not rejoin again and the launcher why
# it relaunches nobody.
file(REMOVE_RECURSE "${WORKDIR}")
file(MAKE_DIRECTORY "${WORKDIR}")
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND "${LAUNCH}" -n ${WORLD} --max-restarts 45 --restart-backoff 0 --grace 5
  -- "${PROGRAM}" ${args}
  WORKING_DIRECTORY "${WORKDIR}" RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err
  TIMEOUT 120)
set(all "${out}${err}")
message("${all}")
if(NOT code EQUAL 3)
  message(FATAL_ERROR "exit ${code}, expected 3 (a restart cannot help)")
endif()
foreach(expect
    "a job of ${WORLD} processes for a pipeline of [0-9]+ stages"
    "rank [0-9]+: not rejoining the job again: the same failure as before restart [0-9]+, before any step \\(a restart cannot help"
    "actorpipe-launch: rank [0-9]+ exited with status 3 \\(a restart cannot help, it says: not relaunched\\)")
  if(NOT all MATCHES "${expect}")
    message(FATAL_ERROR "the output does not say: ${expect}")
  endif()
endforeach()
string(REGEX MATCHALL "rejoins the job|relaunching rank" restarts "${all}")
list(LENGTH restarts n)
math(EXPR bound "3 * ${WORLD}")
if(n GREATER bound)
  message(FATAL_ERROR "${n} relaunches and rejoins for ${WORLD} ranks, expected at most ${bound}")
endif()
message("${n} relaunches and rejoins before the job ended")
