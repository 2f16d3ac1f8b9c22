// Fuzzes the checkpoint manifest reader (checkpoint_info_from_string: what read_checkpoint_info,
// resolve_checkpoint and load_checkpoint do with a manifest.json) with the input as the
// manifest's text. A manifest is read or is an error naming it; one that is read records
// format 1, a step >= 0, and a model compatible with itself.
#include "engine/checkpoint/checkpoint.hpp"
#include "tests/fuzz/fuzz_support.hpp"

using namespace actorpipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto info = checkpoint_info_from_string(fuzz::as_text(data, size), "manifest.json");
  if (!info) {
    FUZZ_CHECK(info.error().message.starts_with("manifest.json"),
               "the error does not name the manifest: {}", info.error().message);
    return 0;
  }
  FUZZ_CHECK(info->format_version == kCheckpointFormatVersion, "format_version {}",
             info->format_version);
  FUZZ_CHECK(info->step >= 0, "step {}", info->step);
  FUZZ_CHECK(check_compatible(*info, info->model).ok(), "a model incompatible with itself");
  (void)checkpoint_name(*info);
  (void)check_compatible(*info, ModelOptions{});
  return 0;
}
