# What actorpipe-custom-layers prints when it works (examples/common/installed_test.cmake); the
# program itself checks its results and exits non-zero naming a failed check.
if(NOT step_output MATCHES "gradient check: [0-9]+ parameter tensors and 4 layers passed\n.*xpipe +actors == serial bitwise.*resumed from step-150: the same bits as the uninterrupted run\n.*custom_layers: all checks passed")
  message(FATAL_ERROR "the program's output is not what it should print")
endif()
