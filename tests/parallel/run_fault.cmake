# SPDX-License-Identifier: Apache-2.0
# Runs `mpirun -np 2 PROGRAM MODE` and passes when the job ends (no hang) within LIMIT seconds,
# with a non-zero status, and its output matches every EXPECT regex (';'-separated).
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -np 2 ${PROGRAM} ${MODE}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT ${LIMIT})
string(TIMESTAMP t1 "%s")
math(EXPR took "${t1} - ${t0}")
message("exit status: ${rc}, ${took} s\n--- stdout\n${out}\n--- stderr\n${err}")
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end by itself within ${LIMIT} s (${rc})")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "the job exited 0; a failure was expected")
endif()
foreach(re IN LISTS EXPECT)
  if(NOT "${out}${err}" MATCHES "${re}")
    message(FATAL_ERROR "the output does not match '${re}'")
  endif()
endforeach()
