# SPDX-License-Identifier: Apache-2.0
# Finds what loom's CPU library needs: oneDNN, OpenMP and zlib (and the OpenCL that Debian's
# oneDNN package config asks for even for CPU use), naming the Debian package to install when
# one is missing. Used by loom's own CMakeLists.txt and, installed, by loom-config.cmake.
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
