# Shared by the multi-process oracles (same_bits, planned_bits, migration_bits).

# actorpipe_fresh_runs(): WORKDIR made fresh with the runs' directories one/ and multi/, and
# `common` set to ARGS ('|'-separated) plus a checkpoint directory, a metrics file and no
# progress lines: the arguments both runs share.
macro(actorpipe_fresh_runs)
  file(REMOVE_RECURSE "${WORKDIR}")
  file(MAKE_DIRECTORY "${WORKDIR}/one" "${WORKDIR}/multi")
  string(REPLACE "|" ";" args "${ARGS}")
  set(common ${args} --set checkpoint.dir=ckpt --set train.metrics=metrics.jsonl
    --set train.log_every=0)
endmacro()

# actorpipe_compare_runs(WORKDIR WHAT): the runs in WORKDIR/one and WORKDIR/multi wrote the same
# checkpoint files (every step and final: model, optimizer, versions, manifest) byte for byte,
# and their metrics files hold the same sequence of step losses, held-out losses and migration
# verdicts (step, partitions, bytes moved); times and the bytes that crossed processes may
# differ. WHAT names the second run in messages. With MOVES_ONLY, verdicts that moved nothing are
# left out (the automatic manager's checks, against a run that repeats its moves as forced
# ones). Sets COMPARED to a one-line summary.
function(actorpipe_compare_runs workdir what)
  cmake_parse_arguments(A "MOVES_ONLY" "" "" ${ARGN})
  file(GLOB_RECURSE files RELATIVE "${workdir}/one/ckpt" "${workdir}/one/ckpt/*")
  list(LENGTH files n)
  if(n EQUAL 0)
    message(FATAL_ERROR "the one-process run wrote no checkpoint")
  endif()
  file(GLOB_RECURSE multi_files RELATIVE "${workdir}/multi/ckpt" "${workdir}/multi/ckpt/*")
  # the directory's lock file names the process that held it
  list(REMOVE_ITEM files lock)
  list(REMOVE_ITEM multi_files lock)
  list(SORT files)
  list(SORT multi_files)
  if(NOT files STREQUAL multi_files)
    message(FATAL_ERROR "checkpoint files differ:\n  one: ${files}\n  ${what}: ${multi_files}")
  endif()
  foreach(f IN LISTS files)
    file(SHA256 "${workdir}/one/ckpt/${f}" a)
    file(SHA256 "${workdir}/multi/ckpt/${f}" b)
    if(NOT a STREQUAL b)
      message(FATAL_ERROR "${f} differs between one process and ${what}")
    endif()
  endforeach()

  # the "loss" of every step line and of every held-out evaluation, and every migration verdict
  set(evals 0)
  set(moves 0)
  foreach(run one multi)
    file(STRINGS "${workdir}/${run}/metrics.jsonl" lines)
    set(seq_${run} "")
    foreach(line IN LISTS lines)
      string(JSON loss ERROR_VARIABLE no_step GET "${line}" loss)
      if(no_step)
        string(JSON migration ERROR_VARIABLE no_migration GET "${line}" migration)
        if(no_migration)
          string(JSON loss GET "${line}" eval loss)
          set(loss "eval:${loss}")
          math(EXPR evals "${evals} + 1")
        else()
          string(JSON step GET "${migration}" step)
          string(JSON moved GET "${migration}" moved)
          string(JSON to GET "${migration}" to)
          string(JSON bytes GET "${migration}" bytes_moved)
          string(REGEX REPLACE "[ \n]" "" to "${to}")
          set(loss "migration:${step}:${moved}:${to}:${bytes}")
          if(moved STREQUAL "ON" OR moved STREQUAL "true")
            math(EXPR moves "${moves} + 1")
          elseif(A_MOVES_ONLY)
            continue()
          endif()
        endif()
      endif()
      list(APPEND seq_${run} "${loss}")
    endforeach()
  endforeach()
  if(NOT seq_one STREQUAL seq_multi OR seq_one STREQUAL "")
    message(FATAL_ERROR "losses differ:\n  one:   ${seq_one}\n  ${what}: ${seq_multi}")
  endif()
  list(LENGTH files nfiles)
  list(LENGTH seq_one nlines)
  math(EXPR evals "${evals} / 2")
  math(EXPR moves "${moves} / 2")
  set(COMPARED "${nfiles} checkpoint files and ${nlines} metrics lines (${evals} held-out losses, ${moves} moves)" PARENT_SCOPE)
endfunction()
