// Trace: Chrome trace event JSON, written by hand (names are action texts; every string is
// escaped anyway) so that a long run's tens of thousands of spans cost one buffer.
#include "actors/api/actorpipe/trace.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

namespace actorpipe {
namespace {

void append_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// Seconds as whole nanoseconds (non-finite or negative times, never produced, count as 0).
int64_t nanos(double seconds) {
  return std::isfinite(seconds) && seconds > 0 ? std::llround(seconds * 1e9) : 0;
}

// Nanoseconds as microseconds with three exact decimals: 1234567 -> "1234.567".
void append_micros(std::string& out, int64_t ns) {
  fmt::format_to(std::back_inserter(out), "{}.{:03}", ns / 1000, ns % 1000);
}

}  // namespace

std::string chrome_trace_json(std::span<const TraceSpan> spans, int stages,
                              std::span<const TraceMark> marks) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out += R"({"ph":"M","pid":1,"tid":0,"name":"process_name","args":{"name":"actorpipe"}})";
  auto track = [&](int tid, const std::string& name, int sort) {
    out += ",\n{\"ph\":\"M\",\"pid\":1,";
    fmt::format_to(std::back_inserter(out),
                   "\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":", tid);
    append_string(out, name);
    fmt::format_to(std::back_inserter(out),
                   "}}}},\n{{\"ph\":\"M\",\"pid\":1,\"tid\":{},\"name\":\"thread_sort_index\","
                   "\"args\":{{\"sort_index\":{}}}}}",
                   tid, sort);
  };
  for (int r = 0; r < stages; ++r) {
    track(r, fmt::format("stage {}", r), 2 * r);
    track(stages + r, fmt::format("stage {} optimizer", r), 2 * r + 1);
  }
  for (const TraceSpan& s : spans) {
    const int64_t start = nanos(s.start);
    const int64_t dur = std::max<int64_t>(0, nanos(s.end) - start);
    out += ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":";
    fmt::format_to(std::back_inserter(out),
                   "{},\"name\":", s.update || s.allreduce ? stages + s.stage : s.stage);
    append_string(out, s.allreduce ? fmt::format("allreduce {}", s.action.version)
                       : s.eval    ? "eval " + to_string(s.action)
                                   : to_string(s.action));
    out += ",\"cat\":";
    append_string(out, s.allreduce ? "allreduce"
                       : s.update  ? "update"
                       : s.eval    ? "eval"
                                   : to_string(s.action.kind));
    out += ",\"ts\":";
    append_micros(out, start);
    out += ",\"dur\":";
    append_micros(out, dur);
    fmt::format_to(std::back_inserter(out), ",\"args\":{{\"microbatch\":{},\"version\":{}}}}}",
                   s.action.microbatch, s.action.version);
  }
  for (const TraceMark& m : marks) {
    out += ",\n{\"ph\":\"i\",\"s\":\"g\",\"pid\":1,\"tid\":0,\"name\":";
    append_string(out, m.name);
    out += ",\"cat\":";
    append_string(out, m.category);
    out += ",\"ts\":";
    append_micros(out, nanos(m.at));
    out += ",\"args\":{\"detail\":";
    append_string(out, m.detail);
    out += "}}";
  }
  out += "\n]}\n";
  return out;
}

Status write_chrome_trace(const std::string& path, std::span<const TraceSpan> spans, int stages,
                          std::span<const TraceMark> marks) {
  const std::string json = chrome_trace_json(spans, stages, marks);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return make_error("train.trace: cannot write {}: {}", path, std::strerror(errno));
  f.write(json.data(), static_cast<std::streamsize>(json.size()));
  f.close();
  if (!f) return make_error("train.trace: writing {} failed: {}", path, std::strerror(errno));
  return {};
}

}  // namespace actorpipe
