// Fuzzes what a remote peer's CAF messages become: the first byte of the input picks a message
// type of the engine, the coordinator or the process group (each with an inspect()), the rest is
// read into it by caf::binary_deserializer, as the middleman reads a message's elements. What
// reads prints (caf::deep_to_string, as logs and failures do; an announcement also through
// to_string and payload_bytes, as a stage that receives one does) and writes back as bytes that
// read back and write as the same bytes (unless it holds an infinity, which CAF cannot write:
// see prints_infinity; SumSq, which crosses as bits, always). The envelope of a caf::message (its
// type names, CAF's own element types) is CAF's and is left to it.
#include <caf/all.hpp>
#include <cctype>
#include <memory>
#include <type_traits>
#include <vector>

#include "actors/coordinator.hpp"
#include "actors/internal/messages.hpp"
#include "actors/process_group.hpp"
#include "tests/fuzz/fuzz_support.hpp"

using namespace actorpipe;
using namespace actorpipe::internal;

namespace {

// The context CAF reads actor handles with: one actor system for the whole run, never
// destroyed.
caf::actor_system& actor_system() {
  static caf::actor_system* sys = [] {
    auto* cfg = new caf::actor_system_config;
    cfg->set("scheduler.max-threads", 1);
    return new caf::actor_system(*cfg);
  }();
  return *sys;
}

void received(const Announcement& a) {
  const std::string text = to_string(a);
  FUZZ_CHECK(!text.empty(), "an empty text");
  auto bytes = payload_bytes(a);
  if (bytes) {
    FUZZ_CHECK(a.shape().size() == static_cast<size_t>(a.ndim), "shape of {}", text);
  } else {
    FUZZ_CHECK(bytes.error().message.find(text) != std::string::npos,
               "the error does not name the announcement: {}", bytes.error().message);
  }
}

void received(const TiedAnnouncement& t) {
  received(t.payload);
}

template <class T>
void received(const T&) {}

// CAF 0.17.6's binary serializer loops forever on an infinite double (detail::pack754 halves it
// until it is below 2), while its deserializer makes one of the exponent bits 0x7ff. A
// receiver reads and prints what arrives, which every input here goes through; writing an
// infinity back is not part of receiving, so the write-back check leaves out values whose text
// holds one (CAF prints doubles with std::to_string: "inf", "-inf").
bool prints_infinity(std::string_view text) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = text.find("inf"); at != std::string_view::npos; at = text.find("inf", at + 1)) {
    if ((at == 0 || !word(text[at - 1])) && (at + 3 == text.size() || !word(text[at + 3]))) {
      return true;
    }
  }
  return false;
}

template <class T>
std::vector<char> write(caf::actor_system& sys, T& x) {
  std::vector<char> out;
  caf::binary_serializer sink{sys, out};
  auto err = sink(x);
  FUZZ_CHECK(!err, "what was read does not write: {}", caf::to_string(err));
  return out;
}

template <class T>
void read_as(const uint8_t* data, size_t size) {
  caf::actor_system& sys = actor_system();
  T x{};
  caf::binary_deserializer source{sys, reinterpret_cast<const char*>(data), size};
  if (source(x)) return;  // an error: the message is dropped
  const std::string text = caf::deep_to_string(x);
  received(x);
  // SumSq writes its doubles as bits (see its inspect()), so whatever it holds is written back
  if (!std::is_same_v<T, SumSq> && prints_infinity(text)) return;
  std::vector<char> bytes = write(sys, x);
  T y{};
  caf::binary_deserializer again{sys, bytes};
  auto err = again(y);
  FUZZ_CHECK(!err, "what was written does not read back: {}", caf::to_string(err));
  FUZZ_CHECK(again.remaining() == 0, "{} bytes left over", again.remaining());
  FUZZ_CHECK(write(sys, y) == bytes, "read back, it writes other bytes");
}

using Reader = void (*)(const uint8_t*, size_t);
constexpr Reader kReaders[] = {
    read_as<Announcement>,   read_as<StageTimes>,
    read_as<UpdateTicket>,   read_as<TiedAnnouncement>,
    read_as<SumSq>,          read_as<Commit>,
    read_as<Failure>,        read_as<RunOutcome>,
    read_as<MigrationEvent>, read_as<std::vector<StageTimes>>,
    read_as<RankInfo>,       read_as<JobTable>,
    read_as<RankPart>,       read_as<std::vector<RankPart>>,
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  actor_system();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  kReaders[data[0] % std::size(kReaders)](data + 1, size - 1);
  return 0;
}
