// SPDX-License-Identifier: Apache-2.0
#pragma once
// What loom reads of Open MPI's runtime and tells a launcher, through the environment only
// (nothing here links against MPI): whether the runtime keeps the survivors of a dead rank
// alive (mpirun --enable-recovery), and how this process ends, for loomrun (bin/loomrun).
// The fault state these decisions change is loom/core/fault.hpp's detail::fault_state.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "loom/core/fault.hpp"

namespace loom {

/// Whether the runtime keeps survivors alive after a rank dies: mpirun --enable-recovery sets
/// OMPI_MCA_orte_enable_recovery=1 in every rank's environment.
inline bool runtime_keeps_survivors() {
  const char* v = std::getenv("OMPI_MCA_orte_enable_recovery");
  return v && (std::string(v) == "1" || std::string(v) == "true");
}

namespace detail {
/// The name of this process in the exit status files instead of its world rank (a replacement
/// of a lost rank, whose MPI_COMM_WORLD is its own: "replacement-<pid>").
inline std::string exit_status_name;

/// Records how this process ends for a launcher (loomrun exports LOOM_STATUS_DIR; under
/// `mpirun --enable-recovery` mpirun's own exit status is 0 whatever the ranks do): writes
/// `<dir>/rank-<world rank>.status` holding `what` ("finished", "failed <code>", "left"), and
/// after "failed ..." " after a peer's failure" where this process saw one
/// (fault_state.peer_failure_seen: loomrun restarts such a job, and does not restart one whose
/// every rank failed by itself). The first call wins. Never throws.
inline void write_exit_status(const std::string& what) noexcept {
  static bool written = false;
  const char* dir = std::getenv("LOOM_STATUS_DIR");
  if (written || !dir || !*dir) return;
  written = true;
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string name = !exit_status_name.empty() ? exit_status_name : rank && *rank ? rank : "0";
  const std::string path = std::string(dir) + "/rank-" + name + ".status";
  const bool failed = what.rfind("failed", 0) == 0;
  if (std::FILE* f = std::fopen(path.c_str(), "w")) {
    std::fprintf(f, "%s%s\n", what.c_str(), failed && fault_state.peer_failure_seen.load() ? " after a peer's failure" : "");
    std::fclose(f);
  }
}
}  // namespace detail

}  // namespace loom
