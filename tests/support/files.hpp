// Whole-file reads and writes for tests that build or inspect files byte by byte.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace actorpipe::testing {

/// The bytes of the file at `p` (empty if it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Replaces the file at `p` by `bytes`.
inline void dump(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace actorpipe::testing
