# SPDX-License-Identifier: Apache-2.0
# cmake -P script run by the package.* tests (tests/package/CMakeLists.txt):
#   1. installs the loom build tree LOOM_BUILD_DIR (component `loom`) into WORK_DIR/prefix,
#   2. configures CONSUMER_SOURCE_DIR with CMAKE_PREFIX_PATH = that prefix (Release),
#   3. builds it,
#   4. runs its program, which must exit 0.
# CONSUMER_CUDA_COMPILER and CONSUMER_CUDA_ARCHITECTURES, when given, configure a CUDA consumer;
# CONSUMER_EXPECT is what the program must print (step 4).
# Everything under WORK_DIR is removed first, so each run starts from nothing.
foreach(v LOOM_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "consumer_test.cmake needs -D${v}=...")
  endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/consumer-build)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

# step(<what> <command...>): runs the command, shows its output, stops the test if it fails;
# the output is left in step_output.
function(step what)
  list(JOIN ARGN " " command)
  message("-- ${what}: ${command}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test: ${what} failed (exit code ${rc})")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# 1. Install: the build tree's `loom` component, or (README) exactly the commands README.md
# gives, in a fresh build folder of the source tree: the fenced block after README's line
# `<!-- install commands: tests/package -->`, with its build folder `build` and prefix
# `/opt/loom` moved under WORK_DIR.
if(DEFINED README)
  file(READ ${README} readme)
  string(FIND "${readme}" "<!-- install commands: tests/package -->" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "package test: ${README} has no line '<!-- install commands: tests/package -->' before its install commands")
  endif()
  string(SUBSTRING "${readme}" ${at} -1 readme)
  if(NOT readme MATCHES "```sh\n([^`]*)```")
    message(FATAL_ERROR "package test: no ```sh block follows README's install-commands line")
  endif()
  string(REPLACE "\n" ";" lines "${CMAKE_MATCH_1}")
  get_filename_component(source_dir ${README} DIRECTORY)
  set(ran 0)
  foreach(line IN LISTS lines)
    if(line STREQUAL "" OR line MATCHES "^#")
      continue()
    endif()
    string(REGEX REPLACE "(^| )build( |$)" "\\1${WORK_DIR}/build\\2" line "${line}")
    string(REPLACE "/opt/loom" "${prefix}" line "${line}")
    step("README: ${line}" sh -c "cd \"${source_dir}\" && ${line}")
    math(EXPR ran "${ran} + 1")
  endforeach()
  if(ran EQUAL 0)
    message(FATAL_ERROR "package test: README's install block holds no command")
  endif()
else()
  set(install_args --install ${LOOM_BUILD_DIR} --prefix ${prefix} --component loom)
  if(LOOM_CONFIG)
    list(APPEND install_args --config ${LOOM_CONFIG})
  endif()
  step("install" ${CMAKE_COMMAND} ${install_args})
endif()
if(NOT EXISTS ${prefix}/share/loom/cmake/loom-config.cmake OR NOT EXISTS ${prefix}/include/loom/nn/model.hpp)
  message(FATAL_ERROR "package test: the install into ${prefix} lacks loom-config.cmake or the headers")
endif()

# 2. Configure the consumer against the prefix only: no package registries, and the same
# generator and compiler as loom's build.
set(configure_args -S ${CONSUMER_SOURCE_DIR} -B ${build} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
    -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
if(CONSUMER_GENERATOR)
  list(APPEND configure_args -G ${CONSUMER_GENERATOR})
endif()
if(CONSUMER_MAKE_PROGRAM)
  list(APPEND configure_args -DCMAKE_MAKE_PROGRAM=${CONSUMER_MAKE_PROGRAM})
endif()
if(CONSUMER_CXX_COMPILER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER=${CONSUMER_CXX_COMPILER})
endif()
# A CUDA consumer: the same nvcc and architectures as loom's build.
if(CONSUMER_CUDA_COMPILER)
  list(APPEND configure_args -DCMAKE_CUDA_COMPILER=${CONSUMER_CUDA_COMPILER}
       "-DCMAKE_CUDA_ARCHITECTURES=${CONSUMER_CUDA_ARCHITECTURES}")
endif()
step("configure the consumer" ${CMAKE_COMMAND} ${configure_args})

# The loom it found must be the one just installed, not another one on the system.
file(STRINGS ${build}/CMakeCache.txt loom_dir REGEX "^loom_DIR:")
string(REGEX REPLACE "^loom_DIR:[A-Z]+=" "" loom_dir "${loom_dir}")
file(REAL_PATH ${prefix} real_prefix)
file(REAL_PATH "${loom_dir}" real_loom_dir)
string(FIND "${real_loom_dir}" "${real_prefix}/" at)
if(NOT at EQUAL 0)
  message(FATAL_ERROR "package test: the consumer found loom in '${loom_dir}', not in ${prefix}")
endif()

# 3. Build.
step("build the consumer" ${CMAKE_COMMAND} --build ${build} --config Release)

# 4. Run.
foreach(candidate ${build}/app ${build}/Release/app ${build}/app.exe ${build}/Release/app.exe)
  if(EXISTS ${candidate})
    set(app ${candidate})
    break()
  endif()
endforeach()
if(NOT app)
  message(FATAL_ERROR "package test: the consumer's program was not found under ${build}")
endif()
step("run the consumer" ${app})
# What the program must print: CONSUMER_EXPECT (a regular expression), by default the training
# consumers' line.
if(NOT DEFINED CONSUMER_EXPECT)
  set(CONSUMER_EXPECT "loom consumer: [0-9]+ parameters, loss")
endif()
if(NOT step_output MATCHES "${CONSUMER_EXPECT}")
  message(FATAL_ERROR "package test: the consumer ran but did not print what it must (${CONSUMER_EXPECT})")
endif()
message("package test: installed, found, built and ran a loom consumer")
