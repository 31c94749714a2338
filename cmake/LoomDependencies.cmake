# SPDX-License-Identifier: Apache-2.0
# Finds what loom's CPU library needs: oneDNN, OpenMP and zlib (and the OpenCL that Debian's
# oneDNN package config asks for even for CPU use), and what its components need (MPI, CUDA,
# NCCL, the image libraries), naming the Debian package to install when one is missing. Used by loom's own CMakeLists.txt and, installed, by loom-config.cmake.
#
#   loom_find_cpu_dependencies()           a missing dependency is a fatal error (building loom)
#   loom_find_cpu_dependencies(PACKAGE)    a missing dependency sets loom_FOUND to FALSE and
#                                          loom_NOT_FOUND_MESSAGE (find_package(loom) of a user)
# Both set loom_DEPENDENCIES_FOUND.

macro(_loom_require found what package)
  if(NOT ${found})
    list(APPEND _loom_missing "${what} (Debian package: ${package})")
  endif()
endmacro()

# A macro, not a function: the imported targets (DNNL::dnnl, OpenMP::OpenMP_CXX, ZLIB::ZLIB)
# and the results must be visible where it is called.
macro(loom_find_cpu_dependencies)
  set(_loom_missing "")
  # Debian's dnnl-config.cmake requires OpenCL (package ocl-icd-opencl-dev) even for CPU use;
  # without it, it stops with a message that does not say which package to install.
  find_package(OpenCL QUIET)
  _loom_require(OpenCL_FOUND "OpenCL headers and loader for oneDNN's CMake package" ocl-icd-opencl-dev)
  if(OpenCL_FOUND)
    find_package(dnnl CONFIG QUIET)
    _loom_require(dnnl_FOUND "oneDNN" libdnnl-dev)
  endif()
  find_package(OpenMP QUIET COMPONENTS CXX)
  _loom_require(OpenMP_CXX_FOUND "OpenMP for C++" "libgomp1 with g++, libomp-dev with Clang")
  find_package(ZLIB QUIET)
  _loom_require(ZLIB_FOUND "zlib" zlib1g-dev)
  set(loom_DEPENDENCIES_FOUND TRUE)
  if(_loom_missing)
    set(loom_DEPENDENCIES_FOUND FALSE)
    list(JOIN _loom_missing "\n  " _loom_missing_text)
    if("${ARGN}" STREQUAL "PACKAGE")
      set(loom_FOUND FALSE)
      set(loom_NOT_FOUND_MESSAGE "loom needs:\n  ${_loom_missing_text}")
    else()
      message(FATAL_ERROR "loom needs:\n  ${_loom_missing_text}")
    endif()
  endif()
  unset(_loom_missing)
  unset(_loom_missing_text)
endmacro()

# The loom::mpi component's dependencies: MPI for C++ (Open MPI) and Boost.MPI, like
# loom_find_cpu_dependencies: fatal when building loom, loom_FOUND/loom_NOT_FOUND_MESSAGE with
# PACKAGE (only when the component was required). Both set loom_mpi_DEPENDENCIES_FOUND.
macro(loom_find_mpi_dependencies)
  set(_loom_missing "")
  find_package(MPI QUIET COMPONENTS CXX)
  _loom_require(MPI_CXX_FOUND "MPI for C++ (Open MPI)" "openmpi-bin libopenmpi-dev")
  find_package(Boost 1.74 QUIET COMPONENTS mpi)
  set(_loom_boost_mpi_found FALSE)
  if(Boost_FOUND AND TARGET Boost::mpi)
    set(_loom_boost_mpi_found TRUE)
  endif()
  _loom_require(_loom_boost_mpi_found "Boost.MPI (1.74 or later)" libboost-mpi-dev)
  set(loom_mpi_DEPENDENCIES_FOUND TRUE)
  if(_loom_missing)
    set(loom_mpi_DEPENDENCIES_FOUND FALSE)
    list(JOIN _loom_missing "\n  " _loom_missing_text)
    if("${ARGN}" STREQUAL "PACKAGE")
      if(loom_FIND_REQUIRED_mpi)
        set(loom_FOUND FALSE)
        set(loom_NOT_FOUND_MESSAGE "loom's mpi component needs:\n  ${_loom_missing_text}")
      endif()
    else()
      message(FATAL_ERROR "loom's mpi component (LOOM_WITH_MPI=ON) needs:\n  ${_loom_missing_text}\n"
                          "Install them (Debian: openmpi-bin libopenmpi-dev libboost-mpi-dev) or configure with -DLOOM_WITH_MPI=OFF.")
    endif()
  endif()
  unset(_loom_missing)
  unset(_loom_missing_text)
  unset(_loom_boost_mpi_found)
endmacro()

# Reports the missing dependencies of a component: fatal when building loom (unless the
# option is AUTO, then a warning and `loom_${component}_DEPENDENCIES_FOUND` FALSE), or
# loom_FOUND/loom_NOT_FOUND_MESSAGE in a user's find_package (when the component is required).
macro(_loom_component_report component mode hint)
  set(loom_${component}_DEPENDENCIES_FOUND TRUE)
  if(_loom_missing)
    set(loom_${component}_DEPENDENCIES_FOUND FALSE)
    list(JOIN _loom_missing "\n  " _loom_missing_text)
    if("${mode}" STREQUAL "PACKAGE")
      if(loom_FIND_REQUIRED_${component})
        set(loom_FOUND FALSE)
        set(loom_NOT_FOUND_MESSAGE "loom's ${component} component needs:\n  ${_loom_missing_text}")
      endif()
    elseif("${mode}" STREQUAL "AUTO")
      message(STATUS "loom: the ${component} component is not built; it needs:\n  ${_loom_missing_text}")
    else()
      message(FATAL_ERROR "loom's ${component} component needs:\n  ${_loom_missing_text}\n${hint}")
    endif()
  endif()
  unset(_loom_missing)
  unset(_loom_missing_text)
endmacro()

# The loom::cuda component's dependencies: the CUDA toolkit (cudart, cuBLAS, cuBLASLt) and
# cuDNN 9, the latter as the imported target loom::cudnn_library. Mode: empty (fatal), AUTO
# (a status message) or PACKAGE. Sets loom_cuda_DEPENDENCIES_FOUND.
macro(loom_find_cuda_dependencies)
  set(_loom_missing "")
  # CMake before 3.26 knows nvcc's dialects only up to C++17; loom (cxx_std_20) needs C++20.
  if(CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA" AND NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  find_package(CUDAToolkit QUIET)
  _loom_require(CUDAToolkit_FOUND "the CUDA toolkit 12 or later (cudart, cuBLAS)"
                "cuda-toolkit-13-0 from NVIDIA's repository, or nvidia-cuda-toolkit")
  if(CUDAToolkit_FOUND)
    foreach(_loom_lib cudart cublas cublasLt)
      set(_loom_has_lib FALSE)
      if(TARGET CUDA::${_loom_lib})
        set(_loom_has_lib TRUE)
      endif()
      _loom_require(_loom_has_lib "the CUDA library ${_loom_lib}" "cuda-libraries-dev-13-0 (NVIDIA) or nvidia-cuda-toolkit")
    endforeach()
    find_path(LOOM_CUDNN_INCLUDE_DIR cudnn.h
              HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include
              PATHS /usr/local/cuda/include /usr/include /usr/local/include
              PATH_SUFFIXES x86_64-linux-gnu)
    find_library(LOOM_CUDNN_LIBRARY NAMES cudnn
                 HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64
                 PATHS /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu)
    set(_loom_cudnn_found FALSE)
    if(LOOM_CUDNN_INCLUDE_DIR AND LOOM_CUDNN_LIBRARY)
      set(_loom_cudnn_found TRUE)
      if(NOT TARGET loom::cudnn_library)
        add_library(loom::cudnn_library UNKNOWN IMPORTED)
        set_target_properties(loom::cudnn_library PROPERTIES
                              IMPORTED_LOCATION "${LOOM_CUDNN_LIBRARY}"
                              INTERFACE_INCLUDE_DIRECTORIES "${LOOM_CUDNN_INCLUDE_DIR}")
      endif()
    endif()
    _loom_require(_loom_cudnn_found "cuDNN 9 (cudnn.h and libcudnn.so)" "cudnn9-cuda-13 (NVIDIA) or nvidia-cudnn")
    unset(_loom_cudnn_found)
    unset(_loom_has_lib)
    unset(_loom_lib)
  endif()
  _loom_component_report(cuda "${ARGN}"
    "Install them or configure with -DLOOM_WITH_CUDA=OFF (AUTO builds loom::cuda only when all are found).")
endmacro()

# The loom::nccl component's dependency: NCCL 2 (nccl.h, libnccl.so), as the imported target
# loom::nccl_library. Mode as loom_find_cuda_dependencies. Sets loom_nccl_DEPENDENCIES_FOUND.
macro(loom_find_nccl_dependencies)
  set(_loom_missing "")
  find_path(LOOM_NCCL_INCLUDE_DIR nccl.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include
            PATHS /usr/local/cuda/include /usr/include /usr/local/include)
  find_library(LOOM_NCCL_LIBRARY NAMES nccl
               HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64
               PATHS /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu)
  set(_loom_nccl_found FALSE)
  if(LOOM_NCCL_INCLUDE_DIR AND LOOM_NCCL_LIBRARY)
    set(_loom_nccl_found TRUE)
    if(NOT TARGET loom::nccl_library)
      add_library(loom::nccl_library UNKNOWN IMPORTED)
      set_target_properties(loom::nccl_library PROPERTIES
                            IMPORTED_LOCATION "${LOOM_NCCL_LIBRARY}"
                            INTERFACE_INCLUDE_DIRECTORIES "${LOOM_NCCL_INCLUDE_DIR}")
    endif()
  endif()
  _loom_require(_loom_nccl_found "NCCL 2 (nccl.h and libnccl.so)" "libnccl-dev (NVIDIA's repository)")
  unset(_loom_nccl_found)
  _loom_component_report(nccl "${ARGN}"
    "Install it or configure with -DLOOM_WITH_NCCL=OFF (AUTO builds loom::nccl only when it is found).")
endmacro()

# The loom::images component's dependencies (loom/data/image.hpp: JPEG and PNG decoding):
# libjpeg-turbo's libjpeg API (libjpeg.pc) and libspng (spng.pc), through pkg-config, as the
# imported targets PkgConfig::LOOM_LIBJPEG and PkgConfig::LOOM_SPNG. Mode as
# loom_find_cuda_dependencies: empty (fatal), AUTO or PACKAGE. Sets loom_images_DEPENDENCIES_FOUND.
macro(loom_find_images_dependencies)
  set(_loom_missing "")
  find_package(PkgConfig QUIET)
  _loom_require(PKG_CONFIG_FOUND "pkg-config (finds libjpeg-turbo and libspng)" pkgconf)
  if(PKG_CONFIG_FOUND)
    if(NOT TARGET PkgConfig::LOOM_LIBJPEG)
      pkg_check_modules(LOOM_LIBJPEG QUIET IMPORTED_TARGET libjpeg)
    endif()
    set(_loom_has_lib FALSE)
    if(TARGET PkgConfig::LOOM_LIBJPEG)
      set(_loom_has_lib TRUE)
    endif()
    _loom_require(_loom_has_lib "libjpeg-turbo's libjpeg API (libjpeg.pc)" libjpeg62-turbo-dev)
    if(NOT TARGET PkgConfig::LOOM_SPNG)
      pkg_check_modules(LOOM_SPNG QUIET IMPORTED_TARGET spng)
    endif()
    set(_loom_has_lib FALSE)
    if(TARGET PkgConfig::LOOM_SPNG)
      set(_loom_has_lib TRUE)
    endif()
    _loom_require(_loom_has_lib "libspng (spng.pc)" libspng-dev)
    unset(_loom_has_lib)
  endif()
  _loom_component_report(images "${ARGN}"
    "Install them (Debian: libjpeg62-turbo-dev libspng-dev) or configure with -DLOOM_WITH_IMAGES=OFF.")
endmacro()
