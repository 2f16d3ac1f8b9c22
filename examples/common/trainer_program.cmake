# actorpipe_trainer_program(NAME <program> DEFAULT_CONFIG <toml>): an example trainer built from
# main.cpp and the shared command line, with <toml> embedded as its default config.
include_guard(GLOBAL)

# The shared command line, compiled once for every trainer program.
add_library(actorpipe_trainer_cli STATIC ${CMAKE_CURRENT_LIST_DIR}/trainer_cli.cpp)
target_link_libraries(actorpipe_trainer_cli PUBLIC actorpipe::actorpipe actorpipe::device
  PRIVATE actorpipe_build_flags)

function(actorpipe_trainer_program)
  cmake_parse_arguments(A "" "NAME;DEFAULT_CONFIG" "" ${ARGN})
  file(READ ${A_DEFAULT_CONFIG} toml)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${A_DEFAULT_CONFIG})
  file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/generated/default_config.hpp
    CONTENT "// Generated from ${A_DEFAULT_CONFIG}: the config used when no --config is given.\n#pragma once\ninline constexpr const char* actorpipe_default_config = R\"toml(@toml@)toml\";\n"
    @ONLY)
  add_executable(${A_NAME} main.cpp)
  target_include_directories(${A_NAME} PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/generated)
  target_link_libraries(${A_NAME} PRIVATE actorpipe_trainer_cli actorpipe_build_flags)
  install(TARGETS ${A_NAME} RUNTIME DESTINATION bin)
endfunction()

# actorpipe_expect_run(NAME <test> COMMAND <exe> [ARGS ...] EXIT <code> [MATCH <regex>]
#                      [FILES <path> ...]): a ctest that runs the command in a fresh directory
# and checks its exit code, that its stdout + stderr match the regex and that the files exist.
function(actorpipe_expect_run)
  cmake_parse_arguments(A "" "NAME;COMMAND;EXIT;MATCH" "ARGS;FILES" ${ARGN})
  string(REPLACE ";" "|" args "${A_ARGS}")
  string(REPLACE ";" "|" files "${A_FILES}")
  add_test(NAME ${A_NAME} COMMAND ${CMAKE_COMMAND} "-DEXE=$<TARGET_FILE:${A_COMMAND}>"
    "-DARGS=${args}" "-DEXIT=${A_EXIT}" "-DMATCH=${A_MATCH}" "-DFILES=${files}"
    "-DWORKDIR=${CMAKE_CURRENT_BINARY_DIR}/runs/${A_NAME}"
    -P ${PROJECT_SOURCE_DIR}/examples/common/expect_run.cmake)
  set_tests_properties(${A_NAME} PROPERTIES LABELS examples TIMEOUT 300
    ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
endfunction()
