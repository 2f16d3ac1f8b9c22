// The skip of a case that runs on one thread only, under ThreadSanitizer: it prints
// "SKIPPED: <reason>" and returns, and CTest's SKIP_REGULAR_EXPRESSION "SKIPPED: " (every
// unit-test executable's cases, cmake/ActorpipeHelpers.cmake) reports it skipped, never passed.
// Such a case has no two threads for TSan to check, and TSan makes its long computation 10-20x
// slower; the Release and AddressSanitizer builds still run it.
#pragma once

#include <iostream>

namespace actorpipe::testing {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

/// True, with the skip line printed, in a ThreadSanitizer build: for a case whose code under test
/// starts no thread (`what` says which computation).
inline bool skip_single_threaded_under_tsan(const char* what) {
  if (!kThreadSanitizer) return false;
  std::cout << "SKIPPED: " << what
            << " runs on one thread: nothing for ThreadSanitizer to check (the Release and "
               "AddressSanitizer builds run it)\n";
  return true;
}

}  // namespace actorpipe::testing
