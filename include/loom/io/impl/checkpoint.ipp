// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of checkpoint.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <charconv>

#include "loom/io/checkpoint.hpp"

namespace loom {
namespace io {
namespace detail {

LOOM_DECL std::string fmt_double(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

LOOM_DECL double parse_double(const std::string& s) { return std::strtod(s.c_str(), nullptr); }

LOOM_DECL std::string shard_name(const char* kind, std::size_t k, std::size_t n) {
  char b[64];
  std::snprintf(b, sizeof b, "%s-%05zu-of-%05zu.safetensors", kind, k + 1, n);
  return b;
}

LOOM_DECL std::size_t covered(std::span<const shard_piece> pieces, std::size_t begin, std::size_t n) {
  std::size_t c = 0;
  for_each_overlap(pieces, begin, n, [&](std::size_t, std::size_t, std::size_t k) { c += k; });
  return c;
}

LOOM_DECL world_map gather_world_map(collectives& c, const shard_map& m) {
  std::vector<std::uint64_t> mine{static_cast<std::uint64_t>(m.replica), static_cast<std::uint64_t>(m.replicas),
                                  static_cast<std::uint64_t>(m.stage), static_cast<std::uint64_t>(m.slice),
                                  m.pieces.size()};
  for (const auto& p : m.pieces)
    mine.insert(mine.end(), {p.whole_offset, p.local_offset, p.count, p.rows, p.whole_stride, p.local_stride,
                             static_cast<std::uint64_t>(p.shared)});
  std::uint64_t width = mine.size();
  c.max(&width, 1);
  mine.resize(width, 0);
  std::vector<std::uint64_t> all(width * static_cast<std::size_t>(c.size()));
  c.allgather(reinterpret_cast<const char*>(mine.data()), reinterpret_cast<char*>(all.data()), width * 8);
  world_map w;
  for (int r = 0; r < c.size(); ++r) {
    const std::uint64_t* v = all.data() + width * static_cast<std::size_t>(r);
    world_map::rank_entry e{static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]),
                            static_cast<int>(v[3]), {}};
    for (std::uint64_t k = 0; k < v[4]; ++k) {
      const std::uint64_t* q = v + 5 + 7 * k;
      e.pieces.push_back({.whole_offset = q[0], .local_offset = q[1], .count = q[2], .rows = q[3],
                          .whole_stride = q[4], .local_stride = q[5], .shared = q[6] != 0});
    }
    w.ranks.push_back(std::move(e));
  }
  return w;
}

LOOM_DECL write_plan plan_writes(const world_map& w, const std::vector<tensor_description>& tensors) {
  write_plan plan;
  const int world = static_cast<int>(w.ranks.size());
  plan.tensors.resize(tensors.size());
  // Largest tensors first, each to the candidate with the fewest bytes so far: the replicas
  // share the writing about evenly (the same choice on every rank).
  std::vector<std::size_t> order(tensors.size());
  for (std::size_t t = 0; t < order.size(); ++t) order[t] = t;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return tensors[a].count > tensors[b].count; });
  std::vector<std::size_t> load(static_cast<std::size_t>(world), 0);
  auto lightest = [&](const std::vector<int>& among) {
    int best = among[0];
    for (int r : among)
      if (load[static_cast<std::size_t>(r)] < load[static_cast<std::size_t>(best)]) best = r;
    return best;
  };
  for (const std::size_t t : order) {
    const auto& d = tensors[t];
    std::vector<int> whole, parts;
    for (int r = 0; r < world; ++r) {
      // A buffer (running statistics) is each replica's own: replica 0's is the one written.
      if (d.kind == tensor_kind::buffer && w.ranks[static_cast<std::size_t>(r)].replica != 0) continue;
      const std::size_t c = covered(w.ranks[static_cast<std::size_t>(r)].pieces, d.offset, d.count);
      if (c == d.count) whole.push_back(r);
      if (c > 0) parts.push_back(r);
    }
    write_plan::tensor_entry e;
    if (!whole.empty()) {
      e.writer = lightest(whole);
    } else {
      const int replicas = std::max(1, w.ranks[0].replicas);
      const int replica = d.kind == tensor_kind::buffer ? 0 : static_cast<int>(t % static_cast<std::size_t>(replicas));
      std::vector<int> group;
      std::size_t sum = 0;
      for (int r : parts)
        if (w.ranks[static_cast<std::size_t>(r)].replica == replica) {
          group.push_back(r);
          sum += covered(w.ranks[static_cast<std::size_t>(r)].pieces, d.offset, d.count);
        }
      if (group.empty() || sum < d.count)
        throw error("loom::checkpoint: internal error: no rank of replica " + std::to_string(replica) +
                    " holds all of tensor " + d.name);
      e.writer = lightest(group);
      for (int r : group)
        if (r != e.writer) e.senders.push_back(r);
    }
    load[static_cast<std::size_t>(e.writer)] += d.count;
    plan.tensors[t] = std::move(e);
  }
  for (const auto& e : plan.tensors)
    if (std::find(plan.writers.begin(), plan.writers.end(), e.writer) == plan.writers.end()) plan.writers.push_back(e.writer);
  std::sort(plan.writers.begin(), plan.writers.end());
  return plan;
}

LOOM_DECL std::size_t contiguous_at(std::span<const shard_piece> pieces, std::size_t begin, std::size_t n) {
  std::size_t runs = 0, at = static_cast<std::size_t>(-1), got = 0;
  for_each_overlap(pieces, begin, n, [&](std::size_t l, std::size_t, std::size_t k) {
    if (runs++ == 0) at = l;
    got += k;
  });
  return runs == 1 && got == n ? at : static_cast<std::size_t>(-1);
}

LOOM_DECL model_layout model_layout_of(const std::vector<tensor_description>& tensors, const shard_map& map) {
  model_layout l;
  for (const auto& t : tensors) {
    if (t.kind == tensor_kind::buffer) continue;
    l.tensors.push_back(t);
    l.parameters.push_back(t);
  }
  for (const auto& t : tensors) {
    if (t.kind != tensor_kind::buffer) continue;
    l.tensors.push_back(t);
    l.tensors.back().offset += map.whole_count;
  }
  l.pieces.assign(map.pieces.begin(), map.pieces.end());
  for (shard_piece p : map.buffer_pieces) {
    p.whole_offset += map.whole_count;
    p.local_offset += map.local_count;
    l.pieces.push_back(p);
  }
  l.map = map;
  l.map.whole_count = map.whole_count + map.whole_buffer_count;
  l.map.local_count = map.local_count + map.local_buffer_count;
  l.map.pieces = l.pieces;
  l.map.whole_buffer_count = l.map.local_buffer_count = 0;
  l.map.buffer_pieces = {};
  return l;
}

LOOM_DECL std::vector<tensor_values> assemble(collectives& c, const world_map& w, const write_plan& plan,
                                              const std::vector<tensor_description>& tensors, const shard_map& held,
                                              const std::vector<const float*>& sources) {
  const int me = c.rank();
  const std::size_t nbuf = sources.size();
  auto source = [&](std::size_t b) -> const float* { return sources[b]; };
  std::vector<tensor_values> out;
  std::vector<float> part;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto& d = tensors[t];
    const auto& e = plan.tensors[t];
    const bool sending = std::find(e.senders.begin(), e.senders.end(), me) != e.senders.end();
    if (sending) {
      for (std::size_t b = 0; b < nbuf; ++b) {
        part.clear();
        const float* src = source(b);
        for_each_overlap(held.pieces, d.offset, d.count,
                         [&](std::size_t l, std::size_t, std::size_t k) { part.insert(part.end(), src + l, src + l + k); });
        c.send(part.data(), part.size(), e.writer, static_cast<int>(t % 30000));
      }
    }
    if (e.writer != me) continue;
    if (const std::size_t at = contiguous_at(held.pieces, d.offset, d.count); e.senders.empty() && at != static_cast<std::size_t>(-1)) {
      // Held whole and contiguous (one process, data_parallel replicas): written from the
      // snapshot itself. A copy here cost as much as the snapshot's own (a first touch of
      // fresh memory for every byte).
      tensor_values tv{t, {}, {}};
      for (std::size_t b = 0; b < nbuf; ++b) tv.views.emplace_back(source(b) + at, d.count);
      out.push_back(std::move(tv));
      continue;
    }
    tensor_values tv{t, std::vector<std::vector<float>>(nbuf, std::vector<float>(d.count)), {}};
    for (std::size_t b = 0; b < nbuf; ++b) {
      const float* src = source(b);
      float* dst = tv.values[b].data();
      for_each_overlap(held.pieces, d.offset, d.count,
                       [&](std::size_t l, std::size_t g, std::size_t k) { std::memcpy(dst + (g - d.offset), src + l, k * 4); });
      for (int r : e.senders) {
        const auto& theirs = w.ranks[static_cast<std::size_t>(r)].pieces;
        part.resize(covered(theirs, d.offset, d.count));
        c.recv(part.data(), part.size(), r, static_cast<int>(t % 30000));
        std::size_t at = 0;
        for_each_overlap(theirs, d.offset, d.count, [&](std::size_t, std::size_t g, std::size_t k) {
          std::memcpy(dst + (g - d.offset), part.data() + at, k * 4);
          at += k;
        });
      }
    }
    for (const auto& v : tv.values) tv.views.emplace_back(v);
    out.push_back(std::move(tv));
  }
  return out;
}

LOOM_DECL partial_file::partial_file(std::filesystem::path target) : target_(std::move(target)) {
  temp_ = target_.parent_path() / ("." + target_.filename().string() + ".tmp");
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int e = errno;
    temp_.clear();
    throw io_error(io::detail::write_failure(target_, "creating a temporary file beside it", e));
  }
}

LOOM_DECL void partial_file::write(const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("writing", w < 0 ? errno : ENOSPC);
    p += w, n -= static_cast<std::size_t>(w), written_ += static_cast<std::uint64_t>(w);
  }
}

LOOM_DECL void partial_file::commit(bool durable) {
  if (durable && ::fsync(fd_) != 0) fail("flushing it to disk", errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) fail("closing it", errno);
  if (::rename(temp_.c_str(), target_.c_str()) != 0) fail("renaming the temporary file into place", errno);
  temp_.clear();
}

LOOM_DECL void partial_file::fail(const char* doing, int e) {
  discard();
  throw io_error(io::detail::write_failure(target_, doing, e));
}

LOOM_DECL void partial_file::discard() noexcept {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (!temp_.empty()) ::unlink(temp_.c_str()), temp_.clear();
}

LOOM_DECL written_file write_tensor_file(const std::filesystem::path& dir, const std::string& name,
                                         const std::vector<named_tensor<float>>& tensors,
                                         std::map<std::string, std::string> metadata) {
  // A count (int64) is written as PyTorch holds it; its CRC covers the bytes written.
  std::vector<std::vector<std::int64_t>> counts;
  for (const auto& t : tensors)
    if (t.int64) {
      counts.emplace_back(t.values.size());
      for (std::size_t i = 0; i < t.values.size(); ++i) counts.back()[i] = static_cast<std::int64_t>(t.values[i]);
    }
  std::vector<std::pair<const void*, std::size_t>> data;  // each tensor's bytes as written
  for (std::size_t k = 0, c = 0; k < tensors.size(); ++k) {
    if (tensors[k].int64) {
      data.emplace_back(counts[c].data(), counts[c].size() * sizeof(std::int64_t));
      ++c;
    } else {
      data.emplace_back(tensors[k].values.data(), tensors[k].values.size_bytes());
    }
  }
  std::string crcs;
  for (std::size_t k = 0; k < tensors.size(); ++k)
    crcs += (crcs.empty() ? "" : ",") + tensors[k].name + "=" + crc32c_hex(crc32c(data[k].first, data[k].second)).data();
  metadata["loom.crc32c"] = crcs;
  std::string header = "{\"__metadata__\":{";
  bool first = true;
  // (Appended piece by piece: g++ 12 warns falsely (-Wrestrict) on "literal" + std::string&&.)
  for (const auto& [k, v] : metadata) {
    if (!first) header += ',';
    header += json::quote(k);
    header += ':';
    header += json::quote(v);
    first = false;
  }
  header += "}";
  std::uint64_t at = 0;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const auto& t = tensors[k];
    const std::uint64_t end = at + data[k].second;
    header += ',';
    header += json::quote(t.name);
    header += t.int64 ? ":{\"dtype\":\"I64\",\"shape\":[" : ":{\"dtype\":\"F32\",\"shape\":[";
    header += io::detail::join(t.shape);
    header += "],\"data_offsets\":[";
    header += std::to_string(at);
    header += ',';
    header += std::to_string(end);
    header += "]}";
    at = end;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  partial_file out(dir / name);
  std::uint32_t crc = crc32c(len, 8);
  crc = crc32c(header.data(), header.size(), crc);
  out.write(len, 8);
  out.write(header);
  for (const auto& [p, n] : data) {
    crc = crc32c(p, n, crc);
    out.write(p, n);
  }
  const std::uint64_t bytes = out.size();
  out.commit(/*durable=*/true);
  return {name, bytes, crc};
}

LOOM_DECL std::pair<std::uint64_t, std::uint32_t> file_crc(const std::filesystem::path& p) {
  input_file f(p);
  std::vector<char> buf(std::size_t{4} << 20);
  std::uint32_t crc = 0;
  for (std::uint64_t at = 0; at < f.size();) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), f.size() - at));
    f.read_at(at, buf.data(), n, "its bytes");
    crc = crc32c(buf.data(), n, crc);
    at += n;
  }
  return {f.size(), crc};
}

LOOM_DECL std::string read_text_file(const std::filesystem::path& p) {
  input_file f(p);
  if (f.size() > (64u << 20)) throw io_error(p.string() + " is " + std::to_string(f.size()) + " bytes: too large for a checkpoint's JSON file");
  std::string s(static_cast<std::size_t>(f.size()), '\0');
  f.read_at(0, s.data(), s.size(), "its text");
  return s;
}

LOOM_DECL void write_text_file(const std::filesystem::path& p, const std::string& text, bool durable) {
  partial_file f(p);
  f.write(text);
  f.commit(durable);
}

LOOM_DECL void fsync_directory(const std::filesystem::path& d) {
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

LOOM_DECL json::value parse_json_file(const std::filesystem::path& p) {
  const std::string text = read_text_file(p);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw io_error(p.string() + " is not valid JSON (" + e.what() + ")");
  }
}

LOOM_DECL const json::value& json_fields::need(std::string_view key) const {
  const json::value* x = v.find(key);
  if (!x) throw io_error(file + " has no field \"" + std::string(key) + "\"");
  return *x;
}

LOOM_DECL std::string json_fields::str(std::string_view key) const {
  const auto& x = need(key);
  if (!x.is_string()) throw io_error(file + ": field \"" + std::string(key) + "\" is not a string");
  return x.text;
}

LOOM_DECL std::uint64_t json_fields::u64(std::string_view key) const {
  std::uint64_t u;
  if (!need(key).to_u64(u)) throw io_error(file + ": field \"" + std::string(key) + "\" is not a non-negative integer");
  return u;
}

LOOM_DECL double json_fields::num(std::string_view key) const {
  const auto& x = need(key);
  if (x.kind != json::value::type::number) throw io_error(file + ": field \"" + std::string(key) + "\" is not a number");
  return parse_double(x.text);
}

LOOM_DECL std::string record_json(const trainer_record& r, const std::vector<written_file>& files, std::size_t writers) {
  using json::quote;
  std::string s = "{\n";
  auto field = [&](const char* k, const std::string& v) { s += "  " + quote(k) + ": " + v + ",\n"; };
  field("format", quote("loom-checkpoint"));
  field("format_version", std::to_string(checkpoint_format_version));
  field("loom_version", quote(std::to_string(LOOM_VERSION_MAJOR) + "." + std::to_string(LOOM_VERSION_MINOR) + "." +
                              std::to_string(LOOM_VERSION_PATCH)));
  field("step", std::to_string(r.step));
  field("epoch", std::to_string(r.epoch));
  field("batch_in_epoch", std::to_string(r.batch_in_epoch));
  field("epoch_loss_sum", fmt_double(r.epoch_sums[0]));
  field("epoch_correct", fmt_double(r.epoch_sums[1]));
  field("epoch_samples", fmt_double(r.epoch_sums[2]));
  field("seed", std::to_string(r.seed));
  field("batch", std::to_string(r.batch));
  field("accumulation", std::to_string(r.accumulation));
  field("epochs", std::to_string(r.epochs));
  field("max_steps", std::to_string(r.max_steps));
  field("deterministic_chunk", std::to_string(r.deterministic_chunk));
  field("samples", std::to_string(r.samples));
  field("data", quote(r.data));
  field("clip_grad_norm", fmt_double(r.clip_grad_norm));
  field("lr", fmt_double(r.lr));
  field("math", quote(r.math));
  {
    char b[32];  // the float's shortest decimal, as trainer_options holds it ("0.1")
    field("label_smoothing", std::string(b, std::to_chars(b, b + sizeof b, static_cast<float>(r.label_smoothing)).ptr));
  }
  field("loss", quote(r.loss));
  field("optimizer", quote(r.optimizer));
  field("optimizer_options", quote(r.optimizer_options));
  field("optimizer_steps", std::to_string(r.optimizer_steps));
  std::string bufs = "[";
  for (std::size_t i = 0; i < r.optimizer_buffers.size(); ++i) bufs += (i ? ", " : "") + quote(r.optimizer_buffers[i]);
  field("optimizer_buffers", bufs + "]");
  field("policy", quote(r.policy));
  field("ranks", std::to_string(r.ranks));
  field("replicas", std::to_string(r.replicas));
  field("stages", std::to_string(r.stages));
  field("slices", std::to_string(r.slices));
  field("network", quote(r.network));
  field("fingerprint", quote(r.fingerprint));
  field("parameter_count", std::to_string(r.parameter_count));
  if (r.ema) {  // (absent without an EMA: such a checkpoint is as before)
    field("ema_decay", fmt_double(r.ema_decay));
    field("ema_every", std::to_string(r.ema_every));
    field("ema_warmup_steps", std::to_string(r.ema_warmup_steps));
    field("ema_updates", std::to_string(r.ema_updates));
  }
  field("writers", std::to_string(writers));
  s += "  \"files\": [";
  for (std::size_t i = 0; i < files.size(); ++i)
    s += std::string(i ? "," : "") + "\n    {\"name\": " + quote(files[i].name) + ", \"bytes\": " +
         std::to_string(files[i].bytes) + ", \"crc32c\": " + quote(crc32c_hex(files[i].crc).data()) + "}";
  s += "\n  ],\n  ";
  // The manifest's own checksum, over every byte before this field.
  const auto crc = crc32c_hex(crc32c(s.data(), s.size()));
  s += "\"manifest_crc32c\": \"" + std::string(crc.data()) + "\"\n}\n";
  return s;
}

LOOM_DECL void check_manifest_crc(const std::string& text, const std::string& file) {
  const std::size_t at = text.rfind("\"manifest_crc32c\"");
  if (at == std::string::npos) throw io_error(file + " has no manifest_crc32c field (not a loom checkpoint, or cut short)");
  const std::size_t q = text.find('"', at + 18);
  if (q == std::string::npos || q + 9 > text.size()) throw io_error(file + ": its manifest_crc32c field is malformed");
  const std::string want = text.substr(q + 1, 8);
  const auto got = crc32c_hex(crc32c(text.data(), at));
  if (want != got.data())
    throw io_error(file + " has CRC-32C " + got.data() + " but says " + want + " (the file is damaged)");
}

LOOM_DECL trainer_record parse_record(const json::value& v, const std::string& file) {
  const json_fields f{v, file};
  trainer_record r;
  r.step = f.u64("step");
  r.epoch = f.u64("epoch");
  r.batch_in_epoch = f.u64("batch_in_epoch");
  r.epoch_sums[0] = f.num("epoch_loss_sum");
  r.epoch_sums[1] = f.num("epoch_correct");
  r.epoch_sums[2] = f.num("epoch_samples");
  r.seed = f.u64("seed");
  r.batch = f.u64("batch");
  r.accumulation = f.u64("accumulation");
  r.epochs = f.u64("epochs");
  r.max_steps = f.u64("max_steps");
  r.deterministic_chunk = f.u64("deterministic_chunk");
  r.samples = f.u64("samples");
  if (const json::value* d = v.find("data"); d && d->is_string()) r.data = d->text;  // absent before shards
  r.clip_grad_norm = f.num("clip_grad_norm");
  r.lr = f.num("lr");
  r.math = f.str("math");
  if (v.find("label_smoothing")) r.label_smoothing = f.num("label_smoothing");  // absent before it
  r.loss = f.str("loss");
  r.optimizer = f.str("optimizer");
  r.optimizer_options = f.str("optimizer_options");
  r.optimizer_steps = f.u64("optimizer_steps");
  const auto& bufs = f.need("optimizer_buffers");
  if (!bufs.is_array()) throw io_error(file + ": field \"optimizer_buffers\" is not an array");
  for (const auto& b : bufs.items) {
    if (!b.is_string()) throw io_error(file + ": field \"optimizer_buffers\" holds a non-string");
    r.optimizer_buffers.push_back(b.text);
  }
  r.policy = f.str("policy");
  r.ranks = static_cast<int>(f.u64("ranks"));
  r.replicas = static_cast<int>(f.u64("replicas"));
  r.stages = static_cast<int>(f.u64("stages"));
  r.slices = static_cast<int>(f.u64("slices"));
  r.network = f.str("network");
  r.fingerprint = f.str("fingerprint");
  r.parameter_count = f.u64("parameter_count");
  if (v.find("ema_decay")) {  // an EMA of the weights (ema-*.safetensors)
    r.ema = true;
    r.ema_decay = f.num("ema_decay");
    r.ema_every = f.u64("ema_every");
    r.ema_warmup_steps = f.u64("ema_warmup_steps");
    r.ema_updates = f.u64("ema_updates");
  }
  return r;
}

LOOM_DECL std::string index_json(const std::vector<tensor_description>& tensors, const write_plan& plan, const char* kind,
                                 const std::vector<std::string>& suffixes) {
  std::uint64_t total = 0;
  std::string map;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const std::string file = shard_name(kind, static_cast<std::size_t>(plan.file_of(plan.tensors[t].writer)), plan.writers.size());
    for (const auto& suffix : suffixes) {
      map += std::string(map.empty() ? "" : ",") + "\n    " + json::quote(tensors[t].name + suffix) + ": " + json::quote(file);
      total += tensors[t].count * (tensors[t].element == tensor_element::int64 ? 8 : 4);
    }
  }
  return "{\n  \"metadata\": {\"total_size\": " + std::to_string(total) + "},\n  \"weight_map\": {" + map + "\n  }\n}\n";
}

LOOM_DECL std::vector<checkpoint_entry> list_checkpoints(const std::filesystem::path& dir) {
  std::vector<checkpoint_entry> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("step-") || !e.is_directory(ec)) continue;
    std::size_t n = 0;
    const char* b = name.data() + 5;
    const char* end = name.data() + name.size();
    auto [p, err] = std::from_chars(b, end, n);
    if (err != std::errc{} || p != end || b == end) continue;
    out.push_back({e.path(), n});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  return out;
}
}  // namespace detail
}  // namespace io
}  // namespace loom

namespace loom {
namespace io {

LOOM_DECL std::vector<checkpoint_entry> list_checkpoints(const std::filesystem::path& dir) {
  return detail::list_checkpoints(dir);
}

LOOM_DECL checkpointer::~checkpointer() {
  // A write still running when the trainer goes (an exception unwinding fit): this rank's
  // files are finished, but rank 0 does not wait for the others' (a peer may be gone) — it
  // abandons the commit and removes the partial directory. Never half a checkpoint.
  if (state_) state_->abort.store(true);
  if (thread_.joinable()) thread_.join();
}

LOOM_DECL void checkpointer::start(collectives& c, const std::filesystem::path& dir, const std::vector<tensor_description>& tensors,
             rank_snapshot snapshot, const trainer_record& record, const std::vector<std::string>& buffer_names,
             bool async, std::size_t keep, double commit_timeout_s) {
  wait(c);
  const std::filesystem::path partial = dir / (".step-" + std::to_string(record.step) + ".partial");
  std::string err;
  if (c.rank() == 0) {
    try {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec) throw io_error("cannot create the checkpoint directory " + dir.string() + ": " + ec.message());
      std::filesystem::remove_all(partial, ec);  // a crashed run's
      if (ec) throw io_error("cannot remove the stale " + partial.string() + ": " + ec.message());
      if (!std::filesystem::create_directory(partial, ec) || ec)
        throw io_error("cannot create " + partial.string() + ": " + (ec ? ec.message() : "it exists"));
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  if (const std::string all = c.agree_on_errors(err); !all.empty())
    throw io_error("loom::checkpoint step-" + std::to_string(record.step) + " in " + dir.string() + ": " + all);
  // The model's tensors: the parameters, then the buffers after them in one layout.
  detail::model_layout layout = detail::model_layout_of(tensors, snapshot.map);
  if (!map_ || map_->ranks.size() != static_cast<std::size_t>(c.size())) {
    map_ = detail::gather_world_map(c, layout.map);
    plan_ = detail::plan_writes(*map_, layout.tensors);
    // The optimizer state, of the parameters only: held as the parameters, or sharded its own
    // way (ZeRO), when its writers are chosen from what each rank holds of it.
    state_map_ = snapshot.own_state_map ? detail::gather_world_map(c, snapshot.state_map) : *map_;
    state_plan_ = detail::plan_writes(*state_map_, layout.parameters);
  }
  // The snapshot's parameters and buffers as one run (the trainer's snapshot lays them so; else
  // a copy, owned by the snapshot).
  if (!snapshot.model_buffers.empty() && snapshot.model_buffers.data() != snapshot.params.data() + snapshot.params.size()) {
    auto joined = std::make_shared<std::vector<float>>(snapshot.params.begin(), snapshot.params.end());
    joined->insert(joined->end(), snapshot.model_buffers.begin(), snapshot.model_buffers.end());
    snapshot.params = std::span<const float>(joined->data(), snapshot.params.size());
    snapshot.model_buffers = std::span<const float>(joined->data() + snapshot.params.size(), snapshot.model_buffers.size());
    snapshot.owner = std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<std::vector<float>>>>(
        snapshot.owner, joined);
  }
  auto snap = std::make_shared<const rank_snapshot>(std::move(snapshot));
  // The EMA of the weights, where there is one: a second source of the model's tensors, written
  // by the same ranks into files of its own.
  std::vector<const float*> model_sources{snap->params.data()};
  if (!snap->ema.empty()) model_sources.push_back(snap->ema.data());
  auto mine = std::make_shared<std::vector<detail::tensor_values>>(
      detail::assemble(c, *map_, plan_, layout.tensors, layout.map, model_sources));
  std::vector<const float*> bufs;
  for (const auto& b : snap->buffers) bufs.push_back(b.data());
  auto mine_state = std::make_shared<std::vector<detail::tensor_values>>();
  if (!bufs.empty())
    *mine_state = detail::assemble(c, *state_map_, state_plan_, layout.parameters, snap->buffers_map(), bufs);
  job j{.dir = dir, .partial = partial, .tensors = layout.tensors, .state_tensors = layout.parameters, .plan = plan_,
        .state_plan = state_plan_,
        .snapshot = std::move(snap), .mine = std::move(mine), .mine_state = std::move(mine_state), .record = record,
        .buffer_names = buffer_names, .rank = c.rank(), .world = c.size(), .keep = keep, .timeout_s = commit_timeout_s,
        .state = std::make_shared<shared_state>()};
  j.record.ema = model_sources.size() > 1;
  state_ = j.state;
  pending_step_ = record.step;
  if (async) {
    thread_ = std::thread([j = std::move(j)]() mutable { run(j); });
  } else {
    run(j);
    wait(c);
  }
}

LOOM_DECL void checkpointer::wait(collectives& c) {
  if (!state_) {
    // Nothing in progress here; still collective, so that ranks stay in step.
    if (const std::string all = c.agree_on_errors(""); !all.empty()) throw io_error(all);
    return;
  }
  auto st = state_;
  const std::size_t step = pending_step_;
  // 1. This rank's own files.
  if (c.rank() != 0) {
    if (thread_.joinable()) thread_.join();
  } else {
    while (!st->files_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::string err = st->files_error;
  const std::string all = c.agree_on_errors(err);
  if (!all.empty()) st->abort.store(true);
  // 2. The commit (rank 0), which every rank's files now allow.
  if (thread_.joinable()) thread_.join();
  state_.reset();
  const std::string commit = c.agree_on_errors(all.empty() ? st->commit_error : "");
  // 3. How long it took, the longest rank's (microseconds, one small allreduce per checkpoint).
  std::uint64_t us = static_cast<std::uint64_t>(std::max(0.0, st->seconds) * 1e6);
  c.max(&us, 1);
  last_seconds_ = static_cast<double>(us) * 1e-6;
  if (!all.empty() || !commit.empty())
    throw io_error("loom::checkpoint step-" + std::to_string(step) + " failed, and the previous checkpoint stays the "
                   "newest: " + (all.empty() ? commit : all));
  last_committed_ = st->committed;
}

LOOM_DECL long long checkpointer::abandon() {
  map_.reset();  // the world changes
  state_map_.reset();
  if (!state_) return -1;
  state_->abort.store(true);
  if (thread_.joinable()) thread_.join();
  state_.reset();
  return static_cast<long long>(pending_step_);
}

LOOM_DECL void checkpointer::run(job& j) {
  shared_state& st = *j.state;
  const auto began = std::chrono::steady_clock::now();
  auto took = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count(); };
  try {
    write_files(j);
  } catch (const std::exception& e) {
    st.files_error = e.what();
  }
  st.seconds = took();
  st.files_done.store(true);
  if (j.rank != 0) return;
  if (!st.files_error.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(j.partial, ec);
    return;
  }
  try {
    st.committed = commit(j);
  } catch (const std::exception& e) {
    st.commit_error = e.what();
    std::error_code ec;
    std::filesystem::remove_all(j.partial, ec);
  }
  st.seconds = took();  // read by wait() after the join
}

LOOM_DECL void checkpointer::write_files(job& j) {
  std::vector<detail::written_file> files;
  const int k = j.plan.file_of(j.rank);
  std::map<std::string, std::string> meta{{"format", "pt"},
                                          {"loom.network", j.record.network},
                                          {"loom.fingerprint", j.record.fingerprint},
                                          {"loom.step", std::to_string(j.record.step)}};
  if (k >= 0) {
    std::vector<named_tensor<float>> model;
    for (const auto& tv : *j.mine) {
      const auto& d = j.tensors[tv.tensor];
      model.push_back({d.name, d.shape, tv.views[0], d.element == tensor_element::int64});
    }
    files.push_back(detail::write_tensor_file(j.partial, detail::shard_name("model", static_cast<std::size_t>(k), j.plan.writers.size()),
                                              model, meta));
    if (j.record.ema) {
      std::vector<named_tensor<float>> ema;
      for (const auto& tv : *j.mine) {
        const auto& d = j.tensors[tv.tensor];
        ema.push_back({d.name, d.shape, tv.views[1], d.element == tensor_element::int64});
      }
      auto ema_meta = meta;
      ema_meta["loom.ema_decay"] = detail::fmt_double(j.record.ema_decay);
      files.push_back(detail::write_tensor_file(
          j.partial, detail::shard_name("ema", static_cast<std::size_t>(k), j.plan.writers.size()), ema, ema_meta));
    }
  }
  if (const int ks = j.state_plan.file_of(j.rank); ks >= 0 && !j.buffer_names.empty()) {
    std::vector<named_tensor<float>> opt;
    for (const auto& tv : *j.mine_state) {
      const auto& d = j.state_tensors[tv.tensor];
      for (std::size_t b = 0; b < j.buffer_names.size(); ++b)
        opt.push_back({d.name + "." + j.buffer_names[b], d.shape, tv.views[b]});
    }
    meta["loom.optimizer"] = j.record.optimizer;
    files.push_back(detail::write_tensor_file(
        j.partial, detail::shard_name("optimizer", static_cast<std::size_t>(ks), j.state_plan.writers.size()), opt, meta));
  }
  j.mine.reset();  // the host copies are no longer needed
  j.mine_state.reset();
  j.snapshot.reset();
  std::string note = "{\"rank\": " + std::to_string(j.rank) + ", \"files\": [";
  for (std::size_t i = 0; i < files.size(); ++i)
    note += std::string(i ? ", " : "") + "{\"name\": " + json::quote(files[i].name) + ", \"bytes\": " +
            std::to_string(files[i].bytes) + ", \"crc32c\": " + json::quote(crc32c_hex(files[i].crc).data()) + "}";
  detail::write_text_file(j.partial / ("rank-" + std::to_string(j.rank) + ".json"), note + "]}\n", /*durable=*/false);
}

LOOM_DECL std::filesystem::path checkpointer::commit(job& j) {
  std::vector<detail::written_file> files;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < j.world; ++r) {
    const auto note = j.partial / ("rank-" + std::to_string(r) + ".json");
    std::error_code ec;
    while (!std::filesystem::exists(note, ec)) {
      if (j.state->abort.load()) throw io_error("abandoned: another rank failed to write its part");
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > j.timeout_s)
        throw io_error("rank " + std::to_string(r) + " left no rank-" + std::to_string(r) + ".json in " +
                       j.partial.string() + " within " + detail::fmt_double(j.timeout_s) +
                       " s (is the checkpoint directory on storage every rank shares?)");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const json::value v = detail::parse_json_file(note);
    const json::value* fs = v.find("files");
    if (!fs || !fs->is_array()) throw io_error(note.string() + " has no files array");
    for (const auto& f : fs->items) {
      const detail::json_fields ff{f, note.string()};
      const std::string crc = ff.str("crc32c");
      files.push_back({ff.str("name"), ff.u64("bytes"), static_cast<std::uint32_t>(std::stoul(crc, nullptr, 16))});
    }
    std::filesystem::remove(note, ec);
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  detail::write_text_file(j.partial / "model.safetensors.index.json", detail::index_json(j.tensors, j.plan, "model", {""}));
  if (j.record.ema)
    detail::write_text_file(j.partial / "ema.safetensors.index.json", detail::index_json(j.tensors, j.plan, "ema", {""}));
  if (!j.buffer_names.empty()) {
    std::vector<std::string> suffixes;
    for (const auto& b : j.buffer_names) suffixes.push_back("." + b);
    detail::write_text_file(j.partial / "optimizer.safetensors.index.json",
                            detail::index_json(j.state_tensors, j.state_plan, "optimizer", suffixes));
  }
  detail::write_text_file(j.partial / "checkpoint.json", detail::record_json(j.record, files, j.plan.writers.size()));
  detail::fsync_directory(j.partial);
  const std::filesystem::path target = j.dir / ("step-" + std::to_string(j.record.step));
  std::error_code ec;
  if (std::filesystem::exists(target, ec)) {
    // The same step saved again (a run resumed from an earlier checkpoint got here anew).
    const auto old = j.dir / (".step-" + std::to_string(j.record.step) + ".replaced");
    std::filesystem::remove_all(old, ec);
    std::filesystem::rename(target, old, ec);
    if (ec) throw io_error("cannot move the older " + target.string() + " aside: " + ec.message());
  }
  if (::rename(j.partial.c_str(), target.c_str()) != 0)
    throw io_error("cannot rename " + j.partial.string() + " to " + target.string() + ": " + std::strerror(errno));
  detail::fsync_directory(j.dir);
  std::filesystem::remove_all(j.dir / (".step-" + std::to_string(j.record.step) + ".replaced"), ec);
  prune(j.dir, j.record.step, j.keep);
  return target;
}

LOOM_DECL void checkpointer::prune(const std::filesystem::path& dir, std::size_t step, std::size_t keep) {
  std::error_code ec;
  if (keep > 0) {
    const auto all = detail::list_checkpoints(dir);
    for (std::size_t i = keep; i < all.size(); ++i) std::filesystem::remove_all(all[i].path, ec);
  }
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(".step-") || !name.ends_with(".partial")) continue;
    const std::string num = name.substr(6, name.size() - 6 - 8);
    std::size_t n = 0;
    auto [p, err] = std::from_chars(num.data(), num.data() + num.size(), n);
    if (err == std::errc{} && p == num.data() + num.size() && n < step) std::filesystem::remove_all(e.path(), ec);
  }
}
}  // namespace io
}  // namespace loom

namespace loom {
namespace io {
namespace detail {

LOOM_DECL loaded_checkpoint read_part(const std::filesystem::path& path, const std::vector<tensor_description>& tensors,
                                      const shard_map& map, const shard_map& state_map, const load_expectation& want,
                                      int rank, int world) {
  loaded_checkpoint out;
  out.path = path;
  const auto manifest_path = path / "checkpoint.json";
  const std::string mf = manifest_path.string();
  const std::string manifest = read_text_file(manifest_path);
  check_manifest_crc(manifest, mf);
  json::value v;
  try {
    v = json::parse(manifest);
  } catch (const json::parse_error& e) {
    throw io_error(mf + " is not valid JSON (" + e.what() + ")");
  }
  if (!v.is_object()) throw io_error(mf + " is not a JSON object");
  const json_fields f{v, mf};
  if (f.str("format") != "loom-checkpoint") throw io_error(mf + ": field \"format\" is \"" + f.str("format") + "\", expected \"loom-checkpoint\"");
  if (const auto ver = f.u64("format_version"); ver != static_cast<std::uint64_t>(checkpoint_format_version))
    throw io_error(mf + " is of checkpoint format version " + std::to_string(ver) + "; this loom reads version " +
                   std::to_string(checkpoint_format_version));
  out.record = parse_record(v, mf);
  const trainer_record& r = out.record;
  if (r.network != want.network)
    throw io_error(mf + " is a checkpoint of " + r.network + ", not of this trainer's " + want.network);
  if (r.parameter_count != want.parameter_count)
    throw io_error(mf + " has " + std::to_string(r.parameter_count) + " parameters; this network has " +
                   std::to_string(want.parameter_count));
  if (r.optimizer != want.optimizer)
    throw io_error(mf + " was saved with optimizer " + r.optimizer + ", not this trainer's " + want.optimizer);
  auto names = [](const std::vector<std::string>& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s + "]";
  };
  if (r.optimizer_buffers != want.buffer_names)
    throw io_error(mf + " holds the optimizer state " + names(r.optimizer_buffers) + " but this " + want.optimizer +
                   " keeps " + names(want.buffer_names) + " (e.g. SGD saved without momentum, loaded with it)");
  // Every file listed: present, of its size (its CRC is checked after the tensors, which name
  // what is damaged more precisely).
  const json::value& files = f.need("files");
  if (!files.is_array() || files.items.empty()) throw io_error(mf + ": field \"files\" lists no files");
  for (std::size_t i = 0; i < files.items.size(); ++i) {
    const json_fields ff{files.items[i], mf};
    const std::string name = ff.str("name");
    if (name.find('/') != std::string::npos || name.starts_with("."))
      throw io_error(mf + ": field \"files\" names " + name + ", not a file of the checkpoint");
    const auto p = path / name;
    std::error_code ec;
    const auto size = std::filesystem::file_size(p, ec);
    if (ec) throw io_error(p.string() + " is missing (checkpoint.json lists it): " + ec.message());
    if (size != ff.u64("bytes"))
      throw io_error(p.string() + " is " + std::to_string(size) + " bytes; checkpoint.json says " +
                     std::to_string(ff.u64("bytes")) + " (truncated or overwritten)");
  }
  // The tensors this rank holds, from the files the indexes name.
  std::map<std::string, std::unique_ptr<safetensors_file>> open;
  auto weight_map = [&](const char* index_name) {
    const auto ip = path / index_name;
    const json::value idx = parse_json_file(ip);
    const json::value* wm = idx.find("weight_map");
    if (!wm || !wm->is_object()) throw io_error(ip.string() + " has no weight_map object");
    std::map<std::string, std::string> m;
    for (const auto& [k, x] : wm->members) {
      if (!x.is_string()) throw io_error(ip.string() + ": weight_map entry " + k + " is not a file name");
      if (x.text.find('/') != std::string::npos || x.text.starts_with("."))
        throw io_error(ip.string() + ": weight_map entry " + k + " names " + x.text + ", not a file of the checkpoint");
      m[k] = x.text;
    }
    return m;
  };
  auto crc_map = [](const safetensors_file& sf) {
    std::map<std::string, std::string> m;
    auto it = sf.metadata().find("loom.crc32c");
    if (it == sf.metadata().end()) throw io_error(sf.path().string() + " has no loom.crc32c in its __metadata__");
    const std::string& s = it->second;
    std::size_t at = 0;
    while (at < s.size()) {
      std::size_t end = s.find(',', at);
      if (end == std::string::npos) end = s.size();
      const std::string item = s.substr(at, end - at);
      const std::size_t eq = item.rfind('=');
      if (eq == std::string::npos) throw io_error(sf.path().string() + ": malformed loom.crc32c entry \"" + item + "\"");
      m[item.substr(0, eq)] = item.substr(eq + 1);
      at = end + 1;
    }
    return m;
  };
  std::map<std::string, std::map<std::string, std::string>> crcs;
  std::vector<float> scratch;  // one buffer for the tensors not read in place (reused: no fresh pages each time)
  auto read_into = [&](const std::map<std::string, std::string>& wm, const std::string& name,
                       const tensor_description& d, std::vector<float>& local, const shard_map& held) {
    auto it = wm.find(name);
    if (it == wm.end()) throw io_error(path.string() + ": the index names no file for tensor " + name);
    auto& sf = open[it->second];
    if (!sf) {
      sf = std::make_unique<safetensors_file>(path / it->second);
      crcs[it->second] = crc_map(*sf);
    }
    const auto* e = sf->find(name);
    if (!e) throw io_error(sf->path().string() + " has no tensor " + name + " (its index says it does)");
    const bool count = d.element == tensor_element::int64;
    if (e->dtype != (count ? "I64" : "F32"))
      throw io_error(sf->path().string() + ": tensor " + name + " is " + e->dtype + ", expected " + (count ? "I64" : "F32"));
    if (e->shape != d.shape)
      throw io_error(sf->path().string() + ": tensor " + name + " has shape " + shape_text(e->shape) + ", expected " +
                     shape_text(d.shape));
    // Held in one contiguous run here: read in place (local is a temporary buffer; nothing is
    // applied before every check passed); else into the scratch buffer and copied piece by piece.
    const std::size_t in_place = count ? static_cast<std::size_t>(-1) : contiguous_at(held.pieces, d.offset, d.count);
    float* whole = nullptr;
    if (in_place != static_cast<std::size_t>(-1)) {
      whole = local.data() + in_place;
    } else {
      if (scratch.size() < d.count) scratch.resize(d.count);
      whole = scratch.data();
    }
    std::vector<std::int64_t> counted(count ? d.count : 0);
    sf->read(*e, count ? static_cast<void*>(counted.data()) : static_cast<void*>(whole));
    const auto& cm = crcs[it->second];
    auto c = cm.find(name);
    if (c == cm.end()) throw io_error(sf->path().string() + " has no CRC-32C for tensor " + name);
    const auto got = count ? crc32c_hex(crc32c(counted.data(), d.count * sizeof(std::int64_t)))
                           : crc32c_hex(crc32c(whole, d.count * 4));
    for (std::size_t i = 0; i < counted.size(); ++i) whole[i] = static_cast<float>(counted[i]);
    if (got.data() != c->second)
      throw io_error(sf->path().string() + ": tensor " + name + " has CRC-32C " + got.data() + ", its header says " +
                     c->second + " (the data is damaged)");
    if (in_place == static_cast<std::size_t>(-1))
      for_each_overlap(held.pieces, d.offset, d.count, [&](std::size_t l, std::size_t g, std::size_t k) {
        std::memcpy(local.data() + l, whole + (g - d.offset), k * 4);
      });
  };
  // The model's tensors in one layout, the buffers after the parameters (model_layout).
  const model_layout layout = model_layout_of(tensors, map);
  std::vector<float> model(layout.map.local_count, 0.0f);
  out.buffers.assign(want.buffer_names.size(), std::vector<float>(state_map.local_count, 0.0f));
  const auto model_map = weight_map("model.safetensors.index.json");
  std::map<std::string, std::string> opt_map;
  if (!want.buffer_names.empty()) opt_map = weight_map("optimizer.safetensors.index.json");
  for (const auto& d : layout.tensors)
    if (covered(layout.map.pieces, d.offset, d.count) > 0) read_into(model_map, d.name, d, model, layout.map);
  for (const auto& d : layout.parameters)
    if (covered(state_map.pieces, d.offset, d.count) > 0)
      for (std::size_t b = 0; b < want.buffer_names.size(); ++b)
        read_into(opt_map, d.name + "." + want.buffer_names[b], d, out.buffers[b], state_map);
  if (want.ema && r.ema) {  // the EMA of the weights: the model's tensors from the ema-* files
    out.ema.assign(layout.map.local_count, 0.0f);
    const auto ema_map = weight_map("ema.safetensors.index.json");
    for (const auto& d : layout.tensors)
      if (covered(layout.map.pieces, d.offset, d.count) > 0) read_into(ema_map, d.name, d, out.ema, layout.map);
  }
  out.params.assign(model.begin(), model.begin() + static_cast<std::ptrdiff_t>(map.local_count));
  out.model_buffers.assign(model.begin() + static_cast<std::ptrdiff_t>(map.local_count), model.end());
  // This rank's share of the whole-file checksums (headers and padding included).
  for (std::size_t i = 0; i < files.items.size(); ++i) {
    if (static_cast<int>(i % static_cast<std::size_t>(world)) != rank) continue;
    const json_fields ff{files.items[i], mf};
    const auto p = path / ff.str("name");
    const auto [bytes, crc] = file_crc(p);
    const std::string want_crc = ff.str("crc32c");
    if (crc32c_hex(crc).data() != want_crc)
      throw io_error(p.string() + " has CRC-32C " + crc32c_hex(crc).data() + "; checkpoint.json says " + want_crc +
                     " (the file is damaged)");
  }
  return out;
}
}  // namespace detail
}  // namespace io
}  // namespace loom

namespace loom {
namespace io {

LOOM_DECL std::optional<loaded_checkpoint> read_checkpoint(collectives& c, const std::filesystem::path& where,
                                                           const std::vector<tensor_description>& tensors,
                                                           const shard_map& map, const load_expectation& want,
                                                           bool none_ok, std::ostream* log,
                                                           const shard_map* state_map) {
  // Rank 0 lists; every rank tries the same candidates.
  std::string listing;
  if (c.rank() == 0) {
    std::error_code ec;
    if (std::filesystem::exists(where / "checkpoint.json", ec)) {
      listing = where.string();
    } else {
      for (const auto& e : detail::list_checkpoints(where)) listing += e.path.string() + "\n";
    }
  }
  listing = c.allgather_text(listing)[0];
  std::vector<std::filesystem::path> candidates;
  for (std::size_t at = 0; at < listing.size();) {
    std::size_t end = listing.find('\n', at);
    if (end == std::string::npos) end = listing.size();
    if (end > at) candidates.emplace_back(listing.substr(at, end - at));
    at = end + 1;
  }
  if (candidates.empty()) {
    if (none_ok) return std::nullopt;
    std::error_code ec;
    throw io_error(std::string("loom::checkpoint: ") + where.string() +
                   (std::filesystem::exists(where, ec) ? " holds no committed checkpoint (no step-<n> directory with a checkpoint.json)"
                                                       : " does not exist"));
  }
  std::string why;
  for (const auto& path : candidates) {
    std::string err;
    std::optional<loaded_checkpoint> mine;
    try {
      mine = detail::read_part(path, tensors, map, state_map ? *state_map : map, want, c.rank(), c.size());
    } catch (const std::exception& e) {
      err = e.what();
    }
    const std::string all = c.agree_on_errors(err);
    if (all.empty()) {
      mine->refused = static_cast<std::size_t>(&path - candidates.data());
      return mine;
    }
    why += "\n  " + path.string() + ": " + all;
    if (log && c.rank() == 0)
      *log << "loom: checkpoint " << path.string() << " cannot be used: " << all
           << (path != candidates.back() ? "; trying the one before it" : "") << "\n";
  }
  throw io_error("loom::checkpoint: no valid checkpoint in " + where.string() + ":" + why);
}
}  // namespace io
}  // namespace loom
