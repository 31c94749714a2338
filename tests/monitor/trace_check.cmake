# SPDX-License-Identifier: Apache-2.0
# Runs PROGRAM on 2 ranks with --trace, then checks the merged timeline and each rank's own with
# CHECK (check_trace.py) under Debian's python3.
find_program(PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT PYTHON3)
  message(FATAL_ERROR "/usr/bin/python3 not found: run scripts/setup")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -np 2 ${PROGRAM} --max-steps 12
                        --train-samples 1280 --test-samples 200 --threads 1 --quiet --trace ${WORK_DIR}/trace.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the example failed (${rc})")
endif()
foreach(pair "trace.json;0,1" "trace.rank0.json;0" "trace.rank1.json;1")
  list(GET pair 0 file)
  list(GET pair 1 ranks)
  execute_process(COMMAND ${PYTHON3} ${CHECK} ${WORK_DIR}/${file} ${ranks} 12 RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${file} fails the structural check")
  endif()
endforeach()
