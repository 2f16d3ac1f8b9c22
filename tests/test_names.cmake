# Every doctest case must be runnable by name from CTest: doctest_discover_tests registers one
# CTest test per case and runs it with --test-case=<name>, and CMake splits a name at ';', so a
# case named "a; b" becomes two CTest tests that each match no case and pass without running
# anything. This script fails naming every such case in the sources under SOURCE_DIR.
file(GLOB_RECURSE sources "${SOURCE_DIR}/*.test.cpp")
set(bad "")
foreach(f IN LISTS sources)
  file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
  if(rel MATCHES "^build")  # build trees inside the source tree
    continue()
  endif()
  # the name may start on the next line and be split into several literals (clang-format)
  file(READ "${f}" content)
  string(REGEX MATCHALL "TEST_CASE\\(([ \t\r\n]*\"[^\"]*\")*[ \t\r\n]*\"[^\"]*;[^\"]*\""
         found "${content}")
  if(found)
    string(REPLACE "\n" " " found "${found}")
    string(REGEX REPLACE "[ ]+" " " found "${found}")
    string(APPEND bad "\n  ${rel}: ${found}")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "test case names with ';' never run under CTest (use ',' instead):${bad}")
endif()
message("every test case name can be run by CTest")
