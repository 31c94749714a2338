# SPDX-License-Identifier: Apache-2.0
# What math.cmake and conv.cmake share: a run of PROGRAM for its training loss, and two such
# losses (printed with 4 decimals) compared in fixed point (CMake has no floating point).

# Runs the command in ARGN (its output shown) and sets <prefix>_rc, <prefix>_err and, when it
# ends with a result line, <prefix>_loss (its train_loss).
function(run_for_loss prefix)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 200)
  message("$ ${ARGN}\nexit status ${rc}\n--- stdout\n${out}--- stderr\n${err}")
  set(${prefix}_rc "${rc}" PARENT_SCOPE)
  set(${prefix}_err "${err}" PARENT_SCOPE)
  set(${prefix}_loss "" PARENT_SCOPE)
  if(rc EQUAL 0)
    if(NOT out MATCHES "train_loss=([0-9.]+)")
      message(FATAL_ERROR "no train_loss= in the result line of: ${ARGN}")
    endif()
    set(${prefix}_loss "${CMAKE_MATCH_1}" PARENT_SCOPE)
  endif()
endfunction()

# Sets out_var to TRUE when |a - b| < a / divisor, else FALSE.
function(losses_within out_var a b divisor)
  string(REGEX REPLACE "\\." "" x "${a}")
  string(REGEX REPLACE "\\." "" y "${b}")
  string(REGEX REPLACE "^0+([0-9])" "\\1" x "${x}")
  string(REGEX REPLACE "^0+([0-9])" "\\1" y "${y}")
  math(EXPR diff "${x} - ${y}")
  if(diff LESS 0)
    math(EXPR diff "0 - ${diff}")
  endif()
  math(EXPR limit "${x} / ${divisor}")
  if(diff LESS limit)
    set(${out_var} TRUE PARENT_SCOPE)
  else()
    set(${out_var} FALSE PARENT_SCOPE)
  endif()
endfunction()
