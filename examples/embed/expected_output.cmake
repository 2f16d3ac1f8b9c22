# What actorpipe-embed prints when it works (examples/common/installed_test.cmake).
if(NOT step_output MATCHES "trained 30 steps: .*\nresumed [^\n]+ at step 30\nlayers.0.wte: 32 x 32")
  message(FATAL_ERROR "the program's output is not what it should print")
endif()
