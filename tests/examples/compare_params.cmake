# SPDX-License-Identifier: Apache-2.0
# Runs the main example on one rank (REFERENCE, a ';'-list: program then flags) and a split
# example under mpirun (NP ranks of PROGRAM with ARGS), and passes when both end with a
# `result:` line and their params_l2 agree within TOLERANCE relative: the split run trained the
# same model as the single-rank run.
function(run_result out_var)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 240)
  message("$ ${ARGN}\nexit status: ${rc}\n--- stdout\n${out}--- stderr (last lines)")
  string(LENGTH "${err}" n)
  if(n GREATER 1500)
    math(EXPR from "${n} - 1500")
    string(SUBSTRING "${err}" ${from} -1 err)
  endif()
  message("${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the run failed (${rc})")
  endif()
  if(NOT out MATCHES "result: [^\n]* params_l2=([0-9.]+)")
    message(FATAL_ERROR "no result: line with params_l2 in the output")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

separate_arguments(args UNIX_COMMAND "${ARGS}")
separate_arguments(reference UNIX_COMMAND "${REFERENCE}")
run_result(expected ${reference})
run_result(got ${MPIEXEC} --allow-run-as-root --oversubscribe -np ${NP} ${PROGRAM} ${args})
# CMake has no floating point: compare in fixed point (params_l2 has 6 decimals).
string(REPLACE "." "" e "${expected}")
string(REPLACE "." "" g "${got}")
math(EXPR diff "${g} - ${e}")
if(diff LESS 0)
  math(EXPR diff "0 - ${diff}")
endif()
# |diff| / e <= TOLERANCE, with TOLERANCE given as parts per 10^7 (TOLERANCE_E7).
math(EXPR lhs "${diff} * 10000000")
math(EXPR rhs "${e} * ${TOLERANCE_E7}")
message("params_l2: single rank ${expected}, split ${got} (difference ${diff} in the 6th decimal)")
if(lhs GREATER rhs)
  message(FATAL_ERROR "params_l2 differs by more than ${TOLERANCE_E7}e-7 relative: ${got} vs ${expected}")
endif()
