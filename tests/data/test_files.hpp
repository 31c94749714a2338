// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers for the data tests: a self-removing temporary directory and writers for small IDX
// files, raw or gzip-compressed (through zlib's gzopen/gzwrite).

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom_test {

/// A fresh directory under the system's temporary directory, removed with its contents.
class temp_dir {
 public:
  temp_dir() {
    std::random_device rd;
    for (int attempt = 0; attempt < 100; ++attempt) {
      const auto candidate = std::filesystem::temp_directory_path() /
                             ("loom-test-data-" + std::to_string(rd()) + std::to_string(rd()));
      if (std::filesystem::create_directory(candidate)) {
        path_ = candidate;
        return;
      }
    }
    throw std::runtime_error("cannot create a temporary directory");
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void put_be32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  out.push_back(static_cast<std::uint8_t>(v >> 24));
  out.push_back(static_cast<std::uint8_t>(v >> 16));
  out.push_back(static_cast<std::uint8_t>(v >> 8));
  out.push_back(static_cast<std::uint8_t>(v));
}

/// The bytes of an IDX file: magic number, big-endian dims, then data.
inline std::vector<std::uint8_t> idx_bytes(std::uint32_t magic,
                                           const std::vector<std::uint32_t>& dims,
                                           const std::vector<std::uint8_t>& data) {
  std::vector<std::uint8_t> out;
  put_be32(out, magic);
  for (std::uint32_t d : dims) put_be32(out, d);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

/// An IDX file of unsigned bytes with the magic number that matches dims.
inline std::vector<std::uint8_t> idx_ubyte(const std::vector<std::uint32_t>& dims,
                                           const std::vector<std::uint8_t>& data) {
  return idx_bytes(0x00000800u | static_cast<std::uint32_t>(dims.size()), dims, data);
}

inline std::filesystem::path write_raw(const std::filesystem::path& file,
                                       const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + file.string());
  return file;
}

inline std::filesystem::path write_gz(const std::filesystem::path& file,
                                      const std::vector<std::uint8_t>& bytes) {
  gzFile gz = gzopen(file.c_str(), "wb");
  if (!gz) throw std::runtime_error("cannot open " + file.string());
  const int wrote =
      bytes.empty() ? 0 : gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size()));
  const int closed = gzclose(gz);
  if (wrote != static_cast<int>(bytes.size()) || closed != Z_OK) {
    throw std::runtime_error("cannot write " + file.string());
  }
  return file;
}

inline std::vector<std::uint8_t> read_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in),
                                   std::istreambuf_iterator<char>());
}

inline std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// n deterministic pseudo-random bytes.
inline std::vector<std::uint8_t> some_bytes(std::size_t n, std::uint32_t salt = 1) {
  std::vector<std::uint8_t> out(n);
  std::uint32_t s = 2463534242u ^ salt;
  for (auto& b : out) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    b = static_cast<std::uint8_t>(s);
  }
  return out;
}

}  // namespace loom_test
