// SPDX-License-Identifier: Apache-2.0
// loom-shards: writes an image classification data set as WebDataset tar shards (SPLIT-000000.tar,
// ...: KEY.png or KEY.jpg and KEY.cls per sample) with loom's manifest SPLIT.shards.json beside
// them, from IDX files (MNIST, Fashion-MNIST), a folder of class folders or a list file; or
// writes the manifest of shards made elsewhere (--scan). Run with --help. docs/data.md.

#include <turbojpeg.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <spng.h>
#include <unistd.h>

#include "loom/core/random.hpp"
#include "loom/data/dataset.hpp"
#include "loom/data/idx.hpp"
#include "loom/data/image.hpp"
#include "loom/data/shards.hpp"
#include "loom/data/tar.hpp"

namespace {

namespace fs = std::filesystem;
using bytes = std::vector<std::byte>;

constexpr const char* usage = R"(usage: loom-shards SOURCE --out DIR [options]
       loom-shards --scan SHARDS

Writes an image classification data set as WebDataset tar shards DIR/SPLIT-000000.tar, ...
(each sample KEY.png or KEY.jpg with its class index in KEY.cls) and loom's manifest
DIR/SPLIT.shards.json, which gives every shard's size and sample count (docs/data.md).

SOURCE, one of:
  --idx DIR              MNIST-layout IDX files ({train,t10k}-{images-idx3,labels-idx1}-ubyte,
                         gzip'd or not), e.g. /usr/share/datasets/fashion-mnist (Debian's
                         dataset-fashion-mnist); writes the splits train and test
  --folder DIR           one sub-folder per class, holding .jpg/.jpeg/.png files; class index =
                         the sub-folder's place in sorted order; writes DIR-OUT/classes.txt
  --list FILE            one "PATH LABEL" per line (PATH relative to FILE's folder)
  --scan SHARDS          no conversion: scan existing shards (a directory, a brace pattern
                         such as 'train-{000000..000127}.tar', or a list file) and write the
                         manifest beside them

options:
  --out DIR              where the shards go (created)
  --split NAME           the split's name for --folder and --list (default train)
  --format png|jpeg      the images' format (default png; --folder and --list keep each file
                         as it is unless --format is given)
  --quality Q            JPEG quality 1..100 (default 95)
  --shard-size BYTES     start a new shard once one holds this many bytes (default 64M; K, M, G
                         suffixes)
  --samples-per-shard N  or: this many samples per shard
  --limit N              only the first N samples of each split (after shuffling)
  --seed N               the order the samples are written in: a permutation drawn from N
                         (default 0); webdataset readers shuffle only within a buffer, so a
                         class-sorted source must be shuffled here
  --no-shuffle           keep the source's order
  --classes N            the number of classes the manifest records (default: the largest
                         label + 1)
)";

[[noreturn]] void fail(const std::string& msg) {
  std::cerr << "loom-shards: " << msg << "\n";
  std::exit(2);
}

std::uint64_t parse_size(std::string_view flag, std::string_view text) {
  std::uint64_t mult = 1;
  if (!text.empty()) {
    const char c = text.back();
    if (c == 'K' || c == 'k') mult = 1ull << 10;
    if (c == 'M' || c == 'm') mult = 1ull << 20;
    if (c == 'G' || c == 'g') mult = 1ull << 30;
    if (mult != 1) text.remove_suffix(1);
  }
  std::uint64_t v = 0;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size() || v == 0)
    fail("--" + std::string(flag) + " needs a positive number, got '" + std::string(text) + "'");
  return v * mult;
}

struct options {
  std::string idx, folder, list, scan, out, split = "train", format;
  int quality = 95;
  std::uint64_t shard_bytes = 64ull << 20, samples_per_shard = 0, limit = 0, seed = 0;
  bool shuffle = true;
  std::size_t classes = 0;
};

/// One sample to write: its encoded image (or where to read it), its extension and label.
struct sample {
  bytes image;
  fs::path file;
  std::string extension;
  std::int64_t label = 0;
};

bytes encode_png(const std::uint8_t* px, std::size_t w, std::size_t h, int channels) {
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<std::uint32_t>(w);
  ihdr.height = static_cast<std::uint32_t>(h);
  ihdr.bit_depth = 8;
  ihdr.color_type = channels == 1 ? SPNG_COLOR_TYPE_GRAYSCALE : SPNG_COLOR_TYPE_TRUECOLOR;
  spng_set_ihdr(ctx, &ihdr);
  int err = spng_encode_image(ctx, px, w * h * static_cast<std::size_t>(channels), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  std::size_t size = 0;
  void* png = err ? nullptr : spng_get_png_buffer(ctx, &size, &err);
  spng_ctx_free(ctx);
  if (!png) throw loom::io_error(std::string("loom-shards: cannot encode a PNG: ") + spng_strerror(err));
  bytes out(size);
  std::memcpy(out.data(), png, size);
  std::free(png);
  return out;
}

bytes encode_jpeg(const std::uint8_t* px, std::size_t w, std::size_t h, int channels, int quality) {
  tjhandle t = tjInitCompress();
  if (!t) throw loom::io_error("loom-shards: cannot start TurboJPEG's compressor");
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(t, px, static_cast<int>(w), 0, static_cast<int>(h), channels == 1 ? TJPF_GRAY : TJPF_RGB,
                             &jpeg, &size, channels == 1 ? TJSAMP_GRAY : TJSAMP_420, quality, TJFLAG_ACCURATEDCT);
  const std::string why = rc ? tjGetErrorStr2(t) : "";
  tjDestroy(t);
  if (rc) {
    tjFree(jpeg);
    throw loom::io_error("loom-shards: cannot encode a JPEG: " + why);
  }
  bytes out(size);
  std::memcpy(out.data(), jpeg, size);
  tjFree(jpeg);
  return out;
}

bytes read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw loom::io_error("loom-shards: cannot open " + p.string());
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

std::string lower_extension(const fs::path& p) {
  std::string e = p.extension().string();
  if (!e.empty()) e.erase(0, 1);
  for (char& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return e == "jpeg" ? "jpg" : e;
}

/// The encoded image of a sample, in --format when given (re-encoding a file of another format).
bytes image_of(sample& s, const options& o, std::string& extension) {
  if (s.file.empty()) {
    extension = s.extension;
    return std::move(s.image);
  }
  bytes b = read_file(s.file);
  const std::string have = lower_extension(s.file);
  const std::string want = o.format.empty() ? have : (o.format == "jpeg" ? "jpg" : o.format);
  extension = want;
  if (want == have) return b;
  loom::data::image_header h;
  const int channels = [&] {
    loom::data::image_scratch scratch;
    loom::data::image_reader r(scratch);
    return r.open(b).channels == 1 ? 1 : 3;
  }();
  const std::vector<std::uint8_t> px = loom::data::decode_image(b, channels, &h);
  return want == "png" ? encode_png(px.data(), h.width, h.height, channels)
                       : encode_jpeg(px.data(), h.width, h.height, channels, o.quality);
}

/// Writes `samples` as SPLIT-000000.tar, ... and SPLIT.shards.json in o.out; prints the counts.
void write_split(std::vector<sample>& samples, const std::string& split, const options& o, std::size_t classes) {
  std::vector<std::size_t> order(samples.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (o.shuffle && order.size() > 1) {
    loom::splitmix64 gen(loom::counter_hash(o.seed, 0x6c6f6f6d73687264ULL, split == "train" ? 0 : split == "test" ? 1 : 2));
    for (std::size_t i = order.size() - 1; i > 0; --i)
      std::swap(order[i], order[static_cast<std::size_t>(gen.below(i + 1))]);
  }
  if (o.limit && order.size() > o.limit) order.resize(o.limit);
  fs::create_directories(o.out);
  loom::data::shard_manifest m;
  std::map<std::int64_t, std::size_t> balance;
  std::optional<loom::data::tar_writer> w;
  fs::path temp, final_path;
  std::uint64_t in_shard = 0;
  const auto finish = [&] {
    w->close();
    fs::rename(temp, final_path);  // never a half-written shard under the final name
    m.shards.push_back({final_path, fs::file_size(final_path), in_shard});
    w.reset();
  };
  const int digits = order.size() >= 100000000 ? 10 : 8;
  const auto mtime = static_cast<std::uint64_t>(std::time(nullptr));
  for (std::size_t n = 0; n < order.size(); ++n) {
    sample& s = samples[order[n]];
    std::string ext;
    const bytes image = image_of(s, o, ext);
    const std::uint64_t need = image.size() + 2048;
    const bool full = w && (o.samples_per_shard ? in_shard >= o.samples_per_shard : w->bytes() + need > o.shard_bytes);
    if (full) finish();
    if (!w) {
      char name[64];
      std::snprintf(name, sizeof name, "%s-%06zu.tar", split.c_str(), m.shards.size());
      final_path = fs::path(o.out) / name;
      temp = fs::path(o.out) / ("." + std::string(name) + ".tmp-" + std::to_string(::getpid()));
      w.emplace(temp);
      in_shard = 0;
    }
    char key[32];
    std::snprintf(key, sizeof key, "%0*zu", digits, n);
    w->add(std::string(key) + "." + ext, image, mtime);
    const std::string label = std::to_string(s.label);
    w->add(std::string(key) + ".cls", std::span(reinterpret_cast<const std::byte*>(label.data()), label.size()), mtime);
    ++in_shard;
    ++balance[s.label];
  }
  if (w) finish();
  m.classes = classes;
  loom::data::write_manifest(fs::path(o.out) / (split + ".shards.json"), m);
  // Shards of an earlier, larger run under the same names would join the set: remove them.
  for (std::size_t k = m.shards.size();; ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "%s-%06zu.tar", split.c_str(), k);
    std::error_code ec;
    if (!fs::remove(fs::path(o.out) / name, ec)) break;
    std::printf("loom-shards: removed %s, left from an earlier run\n", name);
  }
  std::uint64_t bytes_total = 0;
  for (const auto& sh : m.shards) bytes_total += sh.bytes;
  std::printf("loom-shards: %s: %zu samples in %zu shards (%.1f MB) in %s, manifest %s.shards.json\n", split.c_str(),
              order.size(), m.shards.size(), static_cast<double>(bytes_total) / 1e6, o.out.c_str(), split.c_str());
  std::printf("loom-shards: %s: class balance:", split.c_str());
  for (const auto& [label, count] : balance)
    std::printf(" %lld:%zu (%.1f%%)", static_cast<long long>(label), count,
                100.0 * static_cast<double>(count) / static_cast<double>(std::max<std::size_t>(1, order.size())));
  std::printf("\n");
  std::fflush(stdout);
}

std::size_t classes_of(const std::vector<sample>& s, const options& o) {
  if (o.classes) return o.classes;
  std::int64_t top = -1;
  for (const sample& x : s) top = std::max(top, x.label);
  return static_cast<std::size_t>(top + 1);
}

void from_idx(const options& o) {
  for (const loom::data::split sp : {loom::data::split::train, loom::data::split::test}) {
    const std::string prefix = sp == loom::data::split::train ? "train" : "t10k";
    const std::string hint = "expected the MNIST file layout (Debian: apt-get install dataset-fashion-mnist)";
    const auto images = loom::data::detail::find_idx_file(o.idx, prefix + "-images-idx3-ubyte", "images", hint);
    const auto labels = loom::data::detail::find_idx_file(o.idx, prefix + "-labels-idx1-ubyte", "labels", hint);
    const loom::data::idx_array img = loom::data::read_idx(images, 3);
    const loom::data::idx_array lab = loom::data::read_idx(labels, 1);
    if (img.dims[0] != lab.dims[0])
      fail(images.string() + " holds " + std::to_string(img.dims[0]) + " images, " + labels.string() + " " +
           std::to_string(lab.dims[0]) + " labels: expected as many");
    const std::size_t h = img.dims[1], w = img.dims[2];
    std::vector<sample> samples(img.dims[0]);
    // Encoded in order of the output (after the shuffle), lazily: keep pixels, encode at write.
    for (std::size_t i = 0; i < samples.size(); ++i) {
      samples[i].label = lab.data[i];
      const std::uint8_t* px = img.data.data() + i * h * w;
      samples[i].extension = o.format == "jpeg" ? "jpg" : "png";
      samples[i].image = o.format == "jpeg" ? encode_jpeg(px, w, h, 1, o.quality) : encode_png(px, w, h, 1);
    }
    options so = o;
    write_split(samples, sp == loom::data::split::train ? "train" : "test", so, classes_of(samples, o));
  }
}

void from_folder(const options& o) {
  std::vector<fs::path> classes;
  for (const auto& e : fs::directory_iterator(o.folder))
    if (e.is_directory()) classes.push_back(e.path());
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) fail(o.folder + " holds no class folders: expected one sub-folder per class");
  std::vector<sample> samples;
  for (std::size_t c = 0; c < classes.size(); ++c) {
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(classes[c])) {
      const std::string ext = lower_extension(e.path());
      if (e.is_regular_file() && (ext == "jpg" || ext == "png")) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) samples.push_back({{}, f, {}, static_cast<std::int64_t>(c)});
  }
  fs::create_directories(o.out);
  std::ofstream list(fs::path(o.out) / "classes.txt");
  for (std::size_t c = 0; c < classes.size(); ++c) list << c << " " << classes[c].filename().string() << "\n";
  options so = o;
  if (!so.classes) so.classes = classes.size();
  write_split(samples, o.split, so, so.classes);
}

void from_list(const options& o) {
  std::ifstream in(o.list);
  if (!in) fail("cannot open the list " + o.list);
  const fs::path base = fs::path(o.list).parent_path();
  std::vector<sample> samples;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t cut = line.find_last_of(" \t");
    const auto label = cut == std::string::npos ? std::nullopt : loom::data::parse_class_index(line.substr(cut + 1));
    if (!label || *label < 0)
      fail(o.list + ":" + std::to_string(n) + ": expected \"PATH LABEL\" with a class index >= 0, found '" + line + "'");
    fs::path p = line.substr(0, line.find_last_not_of(" \t", cut) + 1);
    if (p.is_relative()) p = base / p;
    const std::string ext = lower_extension(p);
    if (ext != "jpg" && ext != "png") fail(o.list + ":" + std::to_string(n) + ": " + p.string() + " is not a .jpg or .png");
    samples.push_back({{}, p, {}, *label});
  }
  write_split(samples, o.split, o, classes_of(samples, o));
}

void scan(const options& o) {
  const auto shards = loom::data::resolve_shards(o.scan);
  const fs::path where = loom::data::manifest_path_for(shards);
  if (where.empty()) fail("the shards of " + o.scan + " do not share one folder and name prefix: nowhere to put a manifest");
  std::error_code ec;
  fs::remove(where, ec);  // scan, do not trust the old one
  loom::data::shard_manifest m = loom::data::load_manifest(shards, {.cache_dir = {}, .use_cache = false});
  m.classes = o.classes;
  loom::data::write_manifest(where, m);
  std::printf("loom-shards: %zu shards, %llu samples: wrote %s\n", m.shards.size(),
              static_cast<unsigned long long>(m.samples()), where.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  std::vector<std::string_view> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) fail(std::string(a) + " needs a value");
      return std::string(args[++i]);
    };
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      return 0;
    } else if (a == "--idx") o.idx = value();
    else if (a == "--folder") o.folder = value();
    else if (a == "--list") o.list = value();
    else if (a == "--scan") o.scan = value();
    else if (a == "--out") o.out = value();
    else if (a == "--split") o.split = value();
    else if (a == "--format") o.format = value();
    else if (a == "--quality") o.quality = static_cast<int>(parse_size("quality", value()));
    else if (a == "--shard-size") o.shard_bytes = parse_size("shard-size", value());
    else if (a == "--samples-per-shard") o.samples_per_shard = parse_size("samples-per-shard", value());
    else if (a == "--limit") o.limit = parse_size("limit", value());
    else if (a == "--seed") o.seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--no-shuffle") o.shuffle = false;
    else if (a == "--classes") o.classes = parse_size("classes", value());
    else fail("unknown flag '" + std::string(a) + "' (--help lists them)");
  }
  const int sources = !o.idx.empty() + !o.folder.empty() + !o.list.empty() + !o.scan.empty();
  if (sources != 1) fail("expected exactly one of --idx, --folder, --list, --scan (--help)");
  if (o.scan.empty() && o.out.empty()) fail("expected --out DIR");
  if (!o.format.empty() && o.format != "png" && o.format != "jpeg") fail("--format is png or jpeg, got '" + o.format + "'");
  if (o.quality < 1 || o.quality > 100) fail("--quality is 1..100");
  try {
    if (!o.idx.empty()) from_idx(o);
    else if (!o.folder.empty()) from_folder(o);
    else if (!o.list.empty()) from_list(o);
    else scan(o);
  } catch (const std::exception& e) {
    std::cerr << "loom-shards: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
