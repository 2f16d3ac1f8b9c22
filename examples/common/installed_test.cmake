# The installed-package test of an example program (examples/embed, examples/custom_layers):
# `cmake --install` of the actorpipe build tree (BUILD_DIR, component "development": libraries,
# headers, CMake package) into WORK_DIR/prefix, then SOURCE_DIR configured as a separate project
# with CMAKE_PREFIX_PATH=WORK_DIR/prefix, built with GENERATOR, and PROGRAM run with one argument
# (a checkpoint directory). SOURCE_DIR/expected_output.cmake then judges its output
# (step_output). Fails naming the step that failed, with its output.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}/run")

function(step what)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY "${WORK_DIR}/run"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}${err}")
  endif()
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()

step("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
  --component development)
foreach(f include/actorpipe/trainer.hpp include/actorpipe/engine/config/config.hpp
    lib/cmake/actorpipe/actorpipeConfig.cmake)
  if(NOT EXISTS "${WORK_DIR}/prefix/${f}")
    message(FATAL_ERROR "install: ${f} is missing from the prefix")
  endif()
endforeach()
step("configure" ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
step("build" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
step("run" "${WORK_DIR}/build/${PROGRAM}" "${WORK_DIR}/run/checkpoints")
message("${step_output}")
include("${SOURCE_DIR}/expected_output.cmake")
