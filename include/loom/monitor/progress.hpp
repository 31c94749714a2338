// SPDX-License-Identifier: Apache-2.0
#pragma once
// Training progress on a stream: a redrawn bar when the stream is a terminal, plain periodic
// lines (at most one every few seconds, and one per epoch) when it is a file or a pipe.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>

namespace loom {

enum class progress_mode { automatic, bar, lines, off };

class progress_display {
 public:
  /// mode automatic picks bar when `out` is std::cout / std::cerr attached to a terminal.
  progress_display(std::ostream* out, progress_mode mode, bool out_is_tty)
      : out_(out), mode_(mode == progress_mode::automatic ? (out_is_tty ? progress_mode::bar : progress_mode::lines) : mode) {
    if (!out_) mode_ = progress_mode::off;
  }

  /// Reports step `done` of `total` in epoch `epoch` (1-based) with the running loss/accuracy.
  void update(std::size_t epoch, std::size_t epochs, std::size_t done, std::size_t total, double loss, double accuracy,
              double samples_per_s) {
    if (mode_ == progress_mode::off) return;
    const auto now = clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (mode_ == progress_mode::bar) {
      if (since < 0.1 && done != total) return;
      last_ = now;
      const int width = 30;
      const int filled = total ? static_cast<int>(width * done / total) : width;
      std::ostringstream s;
      s << "\repoch " << epoch << "/" << epochs << " [" << std::string(filled, '=') << std::string(width - filled, ' ')
        << "] " << done << "/" << total << " loss " << fmt(loss, 4) << " acc " << fmt(accuracy, 4) << " "
        << fmt(samples_per_s, 0) << " samples/s   ";
      *out_ << s.str() << std::flush;
      if (done == total) *out_ << "\n";
    } else {
      if (since < 5.0 && done != total) return;
      last_ = now;
      *out_ << "epoch " << epoch << "/" << epochs << " step " << done << "/" << total << " loss " << fmt(loss, 4)
            << " acc " << fmt(accuracy, 4) << " " << fmt(samples_per_s, 0) << " samples/s" << std::endl;
    }
  }

 private:
  using clock = std::chrono::steady_clock;
  static std::string fmt(double v, int digits) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", digits, v);
    return b;
  }
  std::ostream* out_;
  progress_mode mode_;
  clock::time_point last_ = clock::now();
};

}  // namespace loom
