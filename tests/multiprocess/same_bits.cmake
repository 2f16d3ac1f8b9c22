# The multi-process oracle: runs PROGRAM (actorpipe-gpt or actorpipe-bert) once in one process and
# once as WORLD processes under LAUNCH (actorpipe-launch, or Open MPI's mpirun when MPIRUN is set)
# with the same ARGS ("|"-separated), then
# requires every checkpoint file (every step and final: model, optimizer, versions, manifest)
# and every step's loss in the metrics file to be the same bits. WORKDIR is made fresh.
file(REMOVE_RECURSE "${WORKDIR}")
file(MAKE_DIRECTORY "${WORKDIR}/one" "${WORKDIR}/multi")
string(REPLACE "|" ";" args "${ARGS}")
set(common ${args} --set checkpoint.dir=ckpt --set train.metrics=metrics.jsonl
  --set train.log_every=0)

execute_process(COMMAND "${PROGRAM}" ${common} WORKING_DIRECTORY "${WORKDIR}/one"
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
execute_process(COMMAND ${launch} "${PROGRAM}" ${common}
  WORKING_DIRECTORY "${WORKDIR}/multi"
  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
message("${out}${err}")
if(NOT code EQUAL 0)
  message(FATAL_ERROR "${WORLD} processes: exit ${code}")
endif()

file(GLOB_RECURSE files RELATIVE "${WORKDIR}/one/ckpt" "${WORKDIR}/one/ckpt/*")
list(LENGTH files n)
if(n EQUAL 0)
  message(FATAL_ERROR "the one-process run wrote no checkpoint")
endif()
file(GLOB_RECURSE multi_files RELATIVE "${WORKDIR}/multi/ckpt" "${WORKDIR}/multi/ckpt/*")
# the directory's lock file names the process that held it
list(REMOVE_ITEM files lock)
list(REMOVE_ITEM multi_files lock)
list(SORT files)
list(SORT multi_files)
if(NOT files STREQUAL multi_files)
  message(FATAL_ERROR "checkpoint files differ:\n  one: ${files}\n  multi: ${multi_files}")
endif()
foreach(f IN LISTS files)
  file(SHA256 "${WORKDIR}/one/ckpt/${f}" a)
  file(SHA256 "${WORKDIR}/multi/ckpt/${f}" b)
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "${f} differs between one process and ${WORLD} processes")
  endif()
endforeach()

# losses: the "loss" of every metrics line (times differ, losses must not)
foreach(run one multi)
  file(STRINGS "${WORKDIR}/${run}/metrics.jsonl" lines)
  set(losses_${run} "")
  foreach(line IN LISTS lines)
    string(JSON loss GET "${line}" loss)
    list(APPEND losses_${run} "${loss}")
  endforeach()
endforeach()
if(NOT losses_one STREQUAL losses_multi OR losses_one STREQUAL "")
  message(FATAL_ERROR "losses differ:\n  one:   ${losses_one}\n  multi: ${losses_multi}")
endif()
list(LENGTH files nfiles)
list(LENGTH losses_one nsteps)
message("same bits: ${nfiles} checkpoint files and ${nsteps} step losses")
