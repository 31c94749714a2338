# SPDX-License-Identifier: Apache-2.0
# No upward includes: each folder of include/loom includes only the folders ARCHITECTURE.md's
# table lets it know (train/ and io/ know everything; the top-level headers, loom.hpp and kin,
# gather the parts). Every header and definition file below a folder counts as the folder's: its
# sub-folders (backend/cpu/, comm/impl/) and the definitions of its non-template functions
# (impl/*.ipp, which the once-compiled libraries compile). Inside parallel/, the strategies'
# sub-folders (data/, pipeline/, tensor/, each with its impl/) sit above the shared engine files
# at parallel/'s top (and parallel/impl/): a shared file includes no strategy's header, and a
# strategy includes no other strategy's, except the cases listed below with their reasons. Run
# by CTest as `header.layering`: cmake -DLOOM_INCLUDE_DIR=<include> -P.
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

# parallel/: the strategies' sub-folders. The shared files that name every strategy (the
# policies that dispatch to them, and the plan that counts each one's buffers) may include
# them all.
set(parallel_strategies data pipeline tensor)
# model_parallel.hpp: model_parallel<Parallelism, Comm> takes a pipeline or a tensor_parallel
# and exposes each one's members; hybrid.hpp: hybrid<data_parallel, Parallelism> names both
# halves; memory_plan.hpp: counts the buffers of every policy's ranks (its policy facts also
# serve world_sizes.hpp).
set(parallel_dispatch loom/parallel/model_parallel.hpp
                      loom/parallel/hybrid.hpp
                      loom/parallel/memory_plan.hpp)
# The hybrids: a pipeline stage and a tensor slice average their gradients over the replicas
# with data parallelism's gradient_allreduce (and a pipeline hybrid's stages shard their
# optimizer state by ZeRO, data/zero_shard.hpp).
set(parallel_exceptions "loom/parallel/pipeline/stage.hpp -> loom/parallel/data/data_parallel.hpp"
                        "loom/parallel/pipeline/engine.hpp -> loom/parallel/data/zero_shard.hpp"
                        "loom/parallel/tensor/sync.hpp -> loom/parallel/data/data_parallel.hpp")

# The strategy sub-folder of parallel/ a path lies in, or "" for parallel/'s shared files.
function(parallel_part path out)
  set(part "")
  if(path MATCHES "^loom/parallel/([a-z_]+)/" AND CMAKE_MATCH_1 IN_LIST parallel_strategies)
    set(part ${CMAKE_MATCH_1})
  endif()
  set(${out} "${part}" PARENT_SCOPE)
endfunction()

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
    if(target_folder STREQUAL "parallel" AND folder STREQUAL "parallel")
      parallel_part(${header} from)
      parallel_part(${target} to)
      if(to STREQUAL "" OR to STREQUAL from OR header IN_LIST parallel_dispatch
         OR "${header} -> ${target}" IN_LIST parallel_exceptions)
        continue()
      endif()
      if(from STREQUAL "")
        string(APPEND problems "\n  ${header} includes ${target}: a shared file of parallel/ includes no strategy's sub-folder")
      else()
        string(APPEND problems "\n  ${header} includes ${target}: parallel/${from}/ includes no other strategy's sub-folder")
      endif()
      continue()
    endif()
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
message("${n} headers and definition files below include/loom/*/ include only the folders they may know, "
        "and parallel/'s shared files and strategies (${parallel_strategies}) only what they may")
