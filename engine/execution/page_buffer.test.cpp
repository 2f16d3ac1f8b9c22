// PageBuffer tests: zeros that cost nothing until written, pages given back, moves.
#include "engine/execution/page_buffer.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <utility>

#include "kernels/check.hpp"

using namespace actorpipe;

TEST_CASE("a page buffer is zeros, resident only where written, and gives whole pages back") {
  const size_t page_floats = static_cast<size_t>(sysconf(_SC_PAGESIZE)) / sizeof(float);
  PageBuffer b(64 * page_floats);
  CHECK(b.size() == 64 * page_floats);
  CHECK(b.resident_bytes() == 0);
  for (size_t i = 0; i < 8 * page_floats; ++i) b.data()[i] = 1.0f;  // pages 0-7
  CHECK(b.resident_bytes() == 8 * page_floats * sizeof(float));
  for (size_t i = 8 * page_floats; i < b.size(); i += page_floats / 2) CHECK(b.data()[i] == 0.0f);
  // floats [page_floats / 2, 6.5 pages): whole pages 1-5 go, 0 and 6 stay whole
  b.release(page_floats / 2, 6 * page_floats);
  CHECK(b.data()[0] == 1.0f);
  CHECK(b.data()[page_floats - 1] == 1.0f);
  CHECK(b.data()[page_floats] == 0.0f);
  CHECK(b.data()[6 * page_floats - 1] == 0.0f);
  CHECK(b.data()[6 * page_floats] == 1.0f);
  CHECK(b.data()[8 * page_floats - 1] == 1.0f);
  // given back again after the reads (which may have mapped the shared zero page), only pages
  // 0, 6 and 7 are resident
  b.release(page_floats, 5 * page_floats);
  b.release(8 * page_floats, 56 * page_floats);
  CHECK(b.resident_bytes() == 3 * page_floats * sizeof(float));
  b.release(0, 0);
  CHECK_THROWS_AS(b.release(b.size(), 1), CheckFailure);

  PageBuffer moved(std::move(b));
  CHECK(moved.data()[0] == 1.0f);
  CHECK(b.data() == nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state
  CHECK(b.resident_bytes() == 0);
  PageBuffer empty(0);
  CHECK(empty.data() == nullptr);
  CHECK(empty.resident_bytes() == 0);
}
