# SPDX-License-Identifier: Apache-2.0
# No upward includes: each folder of include/loom includes only the folders ARCHITECTURE.md's
# table lets it know (train/ and io/ know everything; the top-level headers, loom.hpp and kin,
# gather the parts). Every header and definition file below a folder counts as the folder's: its
# sub-folders (backend/cpu/, comm/impl/) and the definitions of its non-template functions
# (impl/*.ipp, which the once-compiled libraries compile). Run by CTest as `header.layering`:
# cmake -DLOOM_INCLUDE_DIR=<include> -P.
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED LOOM_INCLUDE_DIR)
  message(FATAL_ERROR "layering.cmake -P needs -DLOOM_INCLUDE_DIR=...")
endif()

# folder -> the folders its headers may include (besides itself).
set(knows_core "")
set(knows_backend core)
set(knows_layers core backend)
set(knows_nn core backend layers)
set(knows_models core backend layers nn)
set(knows_optim core backend)
# comm/nccl.hpp runs on CUDA streams: the one header of comm/ that knows backend/cuda.
set(knows_comm core)
# parallel/'s engines own the optimizer step (optim/: clipping) and time their phases (monitor/),
# as docs/trainer.md says; monitor/ knows only core/.
set(knows_parallel core backend layers nn comm optim monitor)
set(knows_data core)
set(knows_monitor core)
# data/decode_pool.hpp sizes the decoding threads from the cores the CPU backend's compute pool
# leaves free (backend/cpu/runtime.hpp), and its threads block signals as that pool's do
# (backend/cpu/signals.hpp).
set(exceptions "loom/comm/nccl.hpp -> loom/backend/cuda/runtime.hpp"
               "loom/data/decode_pool.hpp -> loom/backend/cpu/runtime.hpp"
               "loom/data/decode_pool.hpp -> loom/backend/cpu/signals.hpp")

file(GLOB_RECURSE headers RELATIVE ${LOOM_INCLUDE_DIR} ${LOOM_INCLUDE_DIR}/loom/*/*.hpp ${LOOM_INCLUDE_DIR}/loom/*/*.ipp)
set(problems "")
foreach(header IN LISTS headers)
  string(REGEX MATCH "^loom/([a-z_]+)/" _ ${header})
  set(folder ${CMAKE_MATCH_1})
  if(NOT DEFINED knows_${folder})
    continue()  # train/, io/: may include everything
  endif()
  file(STRINGS ${LOOM_INCLUDE_DIR}/${header} includes REGEX "^#include \"loom/")
  foreach(line IN LISTS includes)
    string(REGEX MATCH "\"(loom/([a-z_]+)[/.][^\"]*)\"" _ "${line}")
    set(target ${CMAKE_MATCH_1})
    set(target_folder ${CMAKE_MATCH_2})
    if(target_folder STREQUAL folder OR target_folder IN_LIST knows_${folder})
      continue()
    endif()
    if("${header} -> ${target}" IN_LIST exceptions)
      continue()
    endif()
    list(JOIN knows_${folder} "/, " known)
    string(APPEND problems "\n  ${header} includes ${target}: ${folder}/ knows only ${folder}/, ${known}/")
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "upward includes (see the folder table in ARCHITECTURE.md):${problems}")
endif()
list(LENGTH headers n)
message("${n} headers and definition files below include/loom/*/ include only the folders they may know")
