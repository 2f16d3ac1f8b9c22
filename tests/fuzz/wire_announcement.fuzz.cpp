// Fuzzes the UCX channel's metadata: an announcement arrives as its raw bytes (the receiver
// takes exactly sizeof(Announcement) bytes into one; a shorter input is padded with zeros).
// Its text (to_string, which errors and logs print) and the check of its payload size
// (payload_bytes: dtype, number of dims, each dim, the total) take any bytes; a size that is
// accepted is the product of its shape.
#include <cstring>

#include "tests/fuzz/fuzz_support.hpp"
#include "transport/wire.hpp"

using namespace actorpipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Announcement a;
  std::memset(static_cast<void*>(&a), 0, sizeof(a));
  std::memcpy(static_cast<void*>(&a), data, std::min(size, sizeof(a)));
  const std::string text = to_string(a);
  auto bytes = payload_bytes(a);
  if (!bytes) {
    FUZZ_CHECK(bytes.error().message.find(text) != std::string::npos,
               "the error does not name the announcement: {}", bytes.error().message);
    return 0;
  }
  size_t product = dtype_size(a.dtype);
  for (int64_t d : a.shape()) product *= static_cast<size_t>(d);
  FUZZ_CHECK(product == *bytes, "{}: {} bytes, the shape says {}", text, *bytes, product);
  return 0;
}
