# SPDX-License-Identifier: Apache-2.0
# Compile-fail tests: programs that must not compile, each failing with the loom message it
# names. This file has two uses:
#
#   include(LoomCompileFail)            in a CMakeLists.txt: defines loom_compile_fail_test() and
#                                       loom_compile_ok_test();
#   cmake -D... -P LoomCompileFail.cmake   run by CTest: builds one case and judges the output.
#
# A case is one .cpp. Its expectations are comment lines at the start of a line:
#   // expect: REGEX        the compiler output must match REGEX (every such line must match,
#                           and the first one must match the first compiler error, so the loom
#                           message is what the user reads first). No ';', '[' or ']' in REGEX
#                           (CMake's lists split at ';' and not inside brackets): write '.'.
#   // max-errors: N        at most N compiler errors (guards against cascades of errors)
# Each case is an OBJECT library, excluded from `all`, linked to loom::loom (so it compiles
# with the flags and include directories of loom and its dependencies); its test builds it.

if(NOT CMAKE_SCRIPT_MODE_FILE)
  set(LOOM_COMPILE_FAIL_SCRIPT ${CMAKE_CURRENT_LIST_FILE})

  # loom_compile_fail_test(<source>): test `compile_fail.<name>` passes when building <source>
  # fails with every `// expect:` regex in the output.
  function(loom_compile_fail_test source)
    _loom_compile_case(${source} FAIL)
  endfunction()

  # loom_compile_ok_test(<source>): test `compile_ok.<name>` passes when <source> builds: the
  # control that proves the harness compiles correct code.
  function(loom_compile_ok_test source)
    _loom_compile_case(${source} OK)
  endfunction()

  function(_loom_compile_case source mode)
    get_filename_component(source ${source} ABSOLUTE)
    get_filename_component(name ${source} NAME_WE)
    if(mode STREQUAL "FAIL")
      file(STRINGS ${source} expects REGEX "^// expect: ")
      if(NOT expects)
        message(FATAL_ERROR "compile-fail case ${source} has no `// expect: <regex>` line")
      endif()
      set(test compile_fail.${name})
    else()
      set(test compile_ok.${name})
    endif()
    set(target loom_${mode}_${name})
    string(TOLOWER ${target} target)
    add_library(${target} OBJECT EXCLUDE_FROM_ALL ${source})
    target_link_libraries(${target} PRIVATE loom::loom)
    # No optimisation: the cases are about diagnostics, and -O0 keeps the control case short.
    target_compile_options(${target} PRIVATE -O0)
    add_test(NAME ${test}
             COMMAND ${CMAKE_COMMAND} -DLOOM_CASE_MODE=${mode} -DLOOM_CASE_SOURCE=${source}
                     -DLOOM_CASE_TARGET=${target} -DLOOM_CASE_BUILD_DIR=${CMAKE_BINARY_DIR}
                     -DLOOM_CASE_CONFIG=$<CONFIG> -P ${LOOM_COMPILE_FAIL_SCRIPT})
    # The cases build in the one build tree: one at a time. English, ASCII-quoted messages.
    set_tests_properties(${test} PROPERTIES RESOURCE_LOCK loom_build_tree ENVIRONMENT "LC_ALL=C"
                                            TIMEOUT 120 LABELS compile)
  endfunction()
  return()
endif()

# ---- Script mode: build one case and judge the output. ------------------------------------
foreach(v LOOM_CASE_MODE LOOM_CASE_SOURCE LOOM_CASE_TARGET LOOM_CASE_BUILD_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "LoomCompileFail.cmake -P needs -D${v}=...")
  endif()
endforeach()

set(build_args --build ${LOOM_CASE_BUILD_DIR} --target ${LOOM_CASE_TARGET})
if(LOOM_CASE_CONFIG)
  list(APPEND build_args --config ${LOOM_CASE_CONFIG})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} ${build_args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)

get_filename_component(case ${LOOM_CASE_SOURCE} NAME)
if(LOOM_CASE_MODE STREQUAL "OK")
  if(NOT rc EQUAL 0)
    message("${out}")
    message(FATAL_ERROR "${case} should compile but does not (see the compiler output above)")
  endif()
  message("${case} compiles, as it should")
  return()
endif()

message("---- compiler output for ${case} ----\n${out}---- end of compiler output ----")
if(rc EQUAL 0)
  message(FATAL_ERROR "${case} compiles but must not: the check it tests is missing")
endif()

# The compiler's error lines, in order ("file:line:col: error: ..." from GCC and Clang); a ';'
# in a message would split it in two list items.
string(REPLACE ";" "," flat "${out}")
string(REGEX MATCHALL "[^\n]*error: [^\n]*" errors "${flat}")
list(LENGTH errors error_count)
if(error_count EQUAL 0)
  message(FATAL_ERROR "${case}: the build failed without a compiler error (exit code ${rc})")
endif()
list(GET errors 0 first_error)

file(STRINGS ${LOOM_CASE_SOURCE} expects REGEX "^// expect: ")
list(TRANSFORM expects REPLACE "^// expect: " "")
set(failures "")
set(first TRUE)
foreach(re IN LISTS expects)
  if(NOT out MATCHES "${re}")
    string(APPEND failures "\n  the output does not contain: ${re}")
  elseif(first AND NOT first_error MATCHES "${re}")
    string(APPEND failures "\n  the first error is not the loom message (${re}) but:\n    ${first_error}")
  endif()
  set(first FALSE)
endforeach()

file(STRINGS ${LOOM_CASE_SOURCE} max_errors REGEX "^// max-errors: [0-9]+")
if(max_errors)
  string(REGEX REPLACE "^// max-errors: ([0-9]+).*" "\\1" max_errors "${max_errors}")
  if(error_count GREATER max_errors)
    string(APPEND failures "\n  ${error_count} compiler errors, more than the ${max_errors} allowed (a cascade after the loom message)")
  endif()
endif()

if(failures)
  message(FATAL_ERROR "${case}:${failures}")
endif()
message("${case} fails to compile with the expected loom message (${error_count} compiler errors)")
