// Failure record: a small text file, "actorpipe failure record 1", "step N", "restart K", then
// the error's text to the end of the file.
#include "transport/failure_record.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace actorpipe {

namespace {

constexpr const char* kHeader = "actorpipe failure record 1";

bool parse_long(const std::string& line, const std::string& key, long& out) {
  if (line.rfind(key + " ", 0) != 0) return false;
  const std::string digits = line.substr(key.size() + 1);
  if (digits.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtol(digits.c_str(), &end, 10);
  return errno == 0 && end != nullptr && *end == '\0';
}

}  // namespace

Expected<std::optional<FailureRecord>> read_failure_record(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !ec) return std::optional<FailureRecord>{};
  std::ifstream in(path, std::ios::binary);
  if (!in || !std::filesystem::is_regular_file(path, ec))
    return make_error("failure record {}: cannot be read: {}", path,
                      ec ? ec.message() : std::string(std::strerror(errno)));
  std::string header, step, restart;
  std::getline(in, header);
  std::getline(in, step);
  std::getline(in, restart);
  FailureRecord r;
  long k = 0;
  if (header != kHeader || !parse_long(step, "step", r.step) || r.step < -1 ||
      !parse_long(restart, "restart", k) || k < 0 || k > 1000000)
    return make_error(
        "failure record {}: not a failure record (expected '{}', 'step N', "
        "'restart K', then the error)",
        path, kHeader);
  r.restart = static_cast<int>(k);
  std::ostringstream rest;
  rest << in.rdbuf();
  r.error = rest.str();
  return std::optional<FailureRecord>{std::move(r)};
}

Status write_failure_record(const std::string& path, const FailureRecord& record) {
  const std::string tmp = path + ".part";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return make_error("failure record {}: cannot be written: {}", path, std::strerror(errno));
    out << kHeader << "\nstep " << record.step << "\nrestart " << record.restart << "\n"
        << record.error;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return make_error("failure record {}: cannot be written: {}", path, std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return make_error("failure record {}: cannot be written: {}", path, std::strerror(e));
  }
  return {};
}

}  // namespace actorpipe
