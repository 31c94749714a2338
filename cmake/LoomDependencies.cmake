# SPDX-License-Identifier: Apache-2.0
# Finds what loom's CPU library needs, failing with the Debian package to install.
include(CMakeFindDependencyMacro)

macro(loom_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR "loom needs ${what}: install it with `apt-get install ${package}`")
  endif()
endmacro()

macro(loom_find_cpu_dependencies)
  # Debian's dnnl-config.cmake looks for OpenCL even for CPU use (package ocl-icd-opencl-dev).
  find_package(OpenCL QUIET)
  loom_require(OpenCL_FOUND "OpenCL headers for oneDNN's CMake package" ocl-icd-opencl-dev)
  find_package(dnnl CONFIG QUIET)
  loom_require(dnnl_FOUND "oneDNN" libdnnl-dev)
  find_package(OpenMP QUIET COMPONENTS CXX)
  loom_require(OpenMP_CXX_FOUND "OpenMP" "g++ (libgomp)")
  find_package(ZLIB QUIET)
  loom_require(ZLIB_FOUND "zlib" zlib1g-dev)
endmacro()
