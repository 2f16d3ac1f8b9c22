// The source whose compile produces the tests' precompiled header (tests/support/test_pch.hpp).
#include "tests/support/test_pch.hpp"
