# Two helpers: actorpipe_add_library declares a library with exact dependencies and
# a namespaced alias; actorpipe_add_test declares a doctest executable registered with CTest.
include_guard(GLOBAL)

# Common warnings, sanitizers and -Werror for every target of the project.
add_library(actorpipe_build_flags INTERFACE)
target_compile_options(actorpipe_build_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${ACTORPIPE_WERROR}>>:-Werror>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${ACTORPIPE_NATIVE}>>:-march=native>)
# A unity build (-DCMAKE_UNITY_BUILD=ON, which scripts/build.sh and scripts/tsan.sh configure)
# compiles a library's sources in batches of 8, each source #included once by a generated unit.
# GCC then takes every source for a header and warns (-Wsubobject-linkage) where a class with
# linkage holds a type of the source's anonymous namespace (a pimpl's Impl): in a header that would
# break the one-definition rule across units, but each source is still in exactly one unit.
if(CMAKE_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(actorpipe_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
endif()
if(ACTORPIPE_SANITIZE)
  # -O1 and line tables only (they follow, so they win over the build type's -O2 -g): halves the
  # sanitized build on 2 cores (toml11 and nlohmann-json units: 106 s -> 53 s each) and still
  # gives every report file:line
  target_compile_options(actorpipe_build_flags INTERFACE
    -fsanitize=${ACTORPIPE_SANITIZE} -fno-omit-frame-pointer -O1 -g1)
  # UBSan's null and alignment checks guard every dereference: in the units instantiating CAF's
  # templates they doubled the compile time (actor_engine.cpp: 69 s -> 35 s without them). A null
  # dereference is still AddressSanitizer's SEGV report with its stack; misaligned reads are the
  # parsers' risk, and the fuzz harnesses (clang) run the parsers with every UBSan check
  if(ACTORPIPE_SANITIZE MATCHES "undefined")
    target_compile_options(actorpipe_build_flags INTERFACE -fno-sanitize=null,alignment)
  endif()
  # GCC's flow analysis sees through the sanitizer instrumentation and reports
  # -Wmaybe-uninitialized inside libstdc++ (std::function in <regex>, std::optional);
  # keep the warning visible but do not fail the sanitized build on it.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(actorpipe_build_flags INTERFACE
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=maybe-uninitialized>)
    # TSan does not model std::atomic_thread_fence (GCC warns, -Wtsan): the tensor pools'
    # acquire fence after a use count of 1 then goes unseen, which can only cause a false report
    # (none seen), never hide one
    # GCC 12 at -O1 with -fsanitize=thread miscompiles a chain of early returns comparing
    # std::array members (the planner test's brute-force order came out wrong):
    # tests/sanitizers/codegen_check.cpp; -fno-tree-forwprop avoids it
    if(ACTORPIPE_SANITIZE STREQUAL "thread")
      target_compile_options(actorpipe_build_flags INTERFACE
        $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=tsan> -fno-tree-forwprop)
    endif()
  endif()
  target_link_options(actorpipe_build_flags INTERFACE -fsanitize=${ACTORPIPE_SANITIZE})
  # LeakSanitizer's suppressions (one cycle inside libcaf's middleman), in every executable
  if(ACTORPIPE_SANITIZE MATCHES "address")
    target_sources(actorpipe_build_flags INTERFACE
      $<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>:${PROJECT_SOURCE_DIR}/tests/sanitizers/lsan_suppressions.cpp>)
  endif()
endif()
if(ACTORPIPE_FUZZ)
  # libFuzzer's coverage without its main (the harnesses link -fsanitize=fuzzer), AddressSanitizer
  # and UndefinedBehaviorSanitizer in every target, -O1 and line tables as above. Undefined
  # behaviour stops the run like a crash, so the fuzzer keeps the input that caused it.
  target_compile_options(actorpipe_build_flags INTERFACE
    -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
    -fno-omit-frame-pointer -O1 -g1)
  target_link_options(actorpipe_build_flags INTERFACE -fsanitize=address,undefined)
endif()

# The linker of every executable and shared library: lld where the compiler can use it
# (scripts/setup.sh installs it). It links a test executable of the sanitized build (80 MB with
# its line tables) in 0.5 s where GNU ld takes 2.0 s, and the suite links about 130 of them per
# build. ACTORPIPE_LINKER=default keeps the compiler's own; lld, gold, mold or bfd ask for one.
set(ACTORPIPE_LINKER auto CACHE STRING
  "The linker: auto (lld if the compiler can use it, else its default), default, lld, gold, mold, bfd")
set_property(CACHE ACTORPIPE_LINKER PROPERTY STRINGS auto default lld gold mold bfd)
if(NOT ACTORPIPE_LINKER MATCHES "^(auto|default|lld|gold|mold|bfd)$")
  message(FATAL_ERROR "ACTORPIPE_LINKER=\"${ACTORPIPE_LINKER}\": expected auto, default, lld, "
    "gold, mold or bfd")
endif()
set(actorpipe_linker "")
if(NOT ACTORPIPE_LINKER STREQUAL "default")
  set(wanted ${ACTORPIPE_LINKER})
  if(wanted STREQUAL "auto")
    set(wanted lld)
  endif()
  include(CheckLinkerFlag)
  check_linker_flag(CXX -fuse-ld=${wanted} ACTORPIPE_CAN_LINK_WITH_${wanted})
  if(ACTORPIPE_CAN_LINK_WITH_${wanted})
    set(actorpipe_linker ${wanted})
  elseif(NOT ACTORPIPE_LINKER STREQUAL "auto")
    message(FATAL_ERROR "ACTORPIPE_LINKER=${ACTORPIPE_LINKER}: ${CMAKE_CXX_COMPILER} cannot link "
      "with -fuse-ld=${wanted} (is the linker installed? Debian: lld, binutils, mold); "
      "ACTORPIPE_LINKER=default uses the compiler's own")
  endif()
endif()
if(actorpipe_linker)
  add_link_options($<$<LINK_LANGUAGE:CXX>:-fuse-ld=${actorpipe_linker}>)
  message(STATUS "actorpipe: linking with ${actorpipe_linker} (ACTORPIPE_LINKER=${ACTORPIPE_LINKER})")
else()
  message(STATUS "actorpipe: linking with the compiler's default linker (ACTORPIPE_LINKER=${ACTORPIPE_LINKER})")
endif()

# The properties of every test that starts several processes: they take the multiprocess lock,
# so they run one after another, each with both cores. The lock makes them a chain as long as the
# rest of the suite, so they carry a COST that makes ctest start them first (the kill_restart
# oracles, the longest, a higher one); the other tests fill the second core meanwhile. (Without
# it a fresh build directory, which has no timing data yet, ran the chain last.)
set(ACTORPIPE_MULTIPROCESS_TEST RESOURCE_LOCK multiprocess COST 100)

# ThreadSanitizer builds: the library tsan_run.sh preloads (built by tests/sanitizers)
set(ACTORPIPE_TSAN_PRELOAD_DIR ${CMAKE_BINARY_DIR}/tests/sanitizers)
set(ACTORPIPE_TSAN_PRELOAD ${ACTORPIPE_TSAN_PRELOAD_DIR}/libactorpipe_caf_happens_before.so)

# actorpipe_add_library(NAME <short> [SOURCES ...] [GLOB_DIR dir] [FLAT] DEPS ... PRIVATE_DEPS ...)
# Creates actorpipe_<short> with alias actorpipe::<short>. With GLOB_DIR, every *.cpp in
# that folder (recursively unless FLAT, except *.test.cpp and the cuda/ subfolder) is a source.
function(actorpipe_add_library)
  cmake_parse_arguments(A "FLAT" "NAME;GLOB_DIR" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  set(srcs ${A_SOURCES})
  if(A_GLOB_DIR)
    if(A_FLAT)
      file(GLOB globbed CONFIGURE_DEPENDS ${A_GLOB_DIR}/*.cpp)
    else()
      file(GLOB_RECURSE globbed CONFIGURE_DEPENDS ${A_GLOB_DIR}/*.cpp)
    endif()
    list(FILTER globbed EXCLUDE REGEX "\\.test\\.cpp$")
    list(FILTER globbed EXCLUDE REGEX "/cuda/")
    list(FILTER globbed EXCLUDE REGEX "/tools/")
    list(APPEND srcs ${globbed})
  endif()
  add_library(actorpipe_${A_NAME} ${srcs})
  add_library(actorpipe::${A_NAME} ALIAS actorpipe_${A_NAME})
  set_target_properties(actorpipe_${A_NAME} PROPERTIES EXPORT_NAME ${A_NAME}
    POSITION_INDEPENDENT_CODE ON)
  target_include_directories(actorpipe_${A_NAME} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:include/actorpipe>)
  target_link_libraries(actorpipe_${A_NAME} PUBLIC ${A_DEPS} PRIVATE ${A_PRIVATE_DEPS}
    $<BUILD_INTERFACE:actorpipe_build_flags>)
  if(ACTORPIPE_SANITIZE)
    # Whoever links a sanitized library (also from the installed package) needs the runtime.
    target_link_options(actorpipe_${A_NAME} INTERFACE -fsanitize=${ACTORPIPE_SANITIZE})
  elseif(ACTORPIPE_FUZZ)
    target_link_options(actorpipe_${A_NAME} INTERFACE -fsanitize=address,undefined)
  endif()
  set_property(GLOBAL APPEND PROPERTY ACTORPIPE_LIBRARIES actorpipe_${A_NAME})
endfunction()

# actorpipe_add_tests(DIR dir [FLAT] [PREFIX p] DEPS ... [LABELS ...] [TIMEOUT s]
#                     [OPTIMIZED name ...])
# Every *.test.cpp under DIR (recursively unless FLAT) becomes one executable whose doctest
# cases are registered with CTest one by one, named <prefix>.<name>.<case>; the prefix is the
# top-level folder unless PREFIX names another (engine.schedule for engine/schedule/).
# A test's own code is compiled at -O0 (below), except the files OPTIMIZED names (without
# .test.cpp): those whose own code computes at length (a brute force, a double reference over
# large shapes, finite differences), which keep the build's level.
function(actorpipe_add_tests)
  cmake_parse_arguments(A "FLAT" "DIR;TIMEOUT;PREFIX" "DEPS;LABELS;OPTIMIZED" ${ARGN})
  if(NOT ACTORPIPE_TESTS)
    return()
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  if(A_FLAT)
    file(GLOB tests CONFIGURE_DEPENDS ${A_DIR}/*.test.cpp)
  else()
    file(GLOB_RECURSE tests CONFIGURE_DEPENDS ${A_DIR}/*.test.cpp)
  endif()
  list(FILTER tests EXCLUDE REGEX "/cuda/")  # declared by their own CMakeLists
  if(TARGET actorpipe_test_pch)
    # the other source every executable of an AddressSanitizer build has (LeakSanitizer's
    # suppressions, above) compiles at the build's level, on its own: without the header
    set_source_files_properties(${PROJECT_SOURCE_DIR}/tests/sanitizers/lsan_suppressions.cpp
      PROPERTIES SKIP_PRECOMPILE_HEADERS ON SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
  foreach(src IN LISTS tests)
    get_filename_component(name ${src} NAME_WE)
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${src})
    string(REGEX REPLACE "/.*" "" top ${rel})
    set(prefix ${top})
    if(A_PREFIX)
      set(prefix ${A_PREFIX})
    endif()
    string(REPLACE "." "_" exe_prefix ${prefix})
    set(exe test_${exe_prefix}_${name})
    add_executable(${exe} ${src})
    # the test's own code (assertions, set-up, oracles over small shapes) at -O0: the code under
    # test runs from the libraries at the build type's level. Source options follow the target's,
    # so this wins over -O3 and the sanitizers' -O1 (actors/api/trainer.test.cpp compiles in 14 s
    # instead of 29 s in Release, 28 s instead of 67 s under ASan + UBSan)
    if(NOT name IN_LIST A_OPTIMIZED)
      set_property(SOURCE ${src} APPEND PROPERTY COMPILE_OPTIONS -O0)
      # doctest, fmt and the standard headers precompiled once (tests/support/test_pch.hpp)
      if(TARGET actorpipe_test_pch)
        target_precompile_headers(${exe} REUSE_FROM actorpipe_test_pch)
      endif()
    endif()
    set_property(GLOBAL APPEND PROPERTY ACTORPIPE_TESTS_${top} ${exe})
    target_link_libraries(${exe} PRIVATE actorpipe_doctest_main ${A_DEPS} actorpipe_build_flags)
    if(ACTORPIPE_SANITIZE STREQUAL "thread")
      # every run (and doctest's listing at build time) goes through the report filter, with
      # libcaf's orderings annotated (tests/sanitizers/caf_happens_before.cpp)
      set_target_properties(${exe} PROPERTIES CROSSCOMPILING_EMULATOR
        "${PROJECT_SOURCE_DIR}/tests/sanitizers/tsan_run.sh;--preload;${ACTORPIPE_TSAN_PRELOAD}")
      add_dependencies(${exe} actorpipe_caf_happens_before)
    endif()
    # one value per property: doctest writes each list element of PROPERTIES as an argument of
    # its own, so the two variables go into two properties (a list in ENVIRONMENT would set only
    # the first and take the second for a property name)
    # a case that cannot run here prints "SKIPPED: <why>" and returns (tests/support/bf16_skip.hpp):
    # CTest reports it skipped, never passed
    # (no ADD_LABELS: it asks the executable once per case for test suites, which no test uses:
    # 3.5 s instead of 0.2 s for actors/api/trainer.test.cpp's 27 cases, at every link)
    doctest_discover_tests(${exe} TEST_PREFIX "${prefix}.${name}."
      PROPERTIES LABELS "${top};${A_LABELS}" TIMEOUT ${A_TIMEOUT}
      SKIP_REGULAR_EXPRESSION "SKIPPED: "
      ENVIRONMENT "ACTORPIPE_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
      ENVIRONMENT_MODIFICATION "OPENBLAS_NUM_THREADS=set:1"
      WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  endforeach()
endfunction()
