# A job that must not start: runs PROGRAM under actorpipe-launch with WORLD processes and ARGS
# ('|'-separated; RANK1_ARGS are added for rank 1 only, through a wrapper script), and requires a
# non-zero exit within the timeout and EXPECT (a regular expression) in the output.
file(REMOVE_RECURSE "${WORKDIR}")
file(MAKE_DIRECTORY "${WORKDIR}")
string(REPLACE "|" ";" args "${ARGS}")
string(REPLACE "|" " " rank1_args "${RANK1_ARGS}")
set(wrapper "${WORKDIR}/rank1_differs.sh")
file(WRITE "${wrapper}" "#!/bin/sh\nif [ \"$ACTORPIPE_RANK\" = 1 ]; then exec \"$@\" ${rank1_args}; fi\nexec \"$@\"\n")
file(CHMOD "${wrapper}" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
execute_process(COMMAND "${LAUNCH}" -n ${WORLD} --grace 5 -- "${wrapper}" "${PROGRAM}" ${args}
  WORKING_DIRECTORY "${WORKDIR}" RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err
  TIMEOUT 120)
message("${out}${err}")
if(code EQUAL 0)
  message(FATAL_ERROR "the job ran, but it must fail at start")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "exit ${code}, but the output does not say: ${EXPECT}")
endif()
