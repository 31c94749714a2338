# SPDX-License-Identifier: Apache-2.0
# cmake -P script of the test scripts.gpu_check: the parts of scripts/gpu-check that run on
# any machine — --help, a bad argument, and the path of a machine without a GPU.
#   -DSCRIPT=<repo>/scripts/gpu-check -DWORK_DIR=<scratch>
function(run expect_rc expect_text)
  execute_process(COMMAND bash ${SCRIPT} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL expect_rc)
    message(FATAL_ERROR "gpu-check ${ARGN}: exit code ${rc}, expected ${expect_rc}\n${out}\n${err}")
  endif()
  string(FIND "${out}${err}" "${expect_text}" at)
  if(at LESS 0)
    message(FATAL_ERROR "gpu-check ${ARGN}: the output lacks '${expect_text}':\n${out}\n${err}")
  endif()
endfunction()

run(0 "usage: scripts/gpu-check" --help)
run(2 "unknown argument '--no-such-option'" --no-such-option)
run(2 "--arch takes a compute capability" --arch 9.0)
set(ENV{LOOM_GPU_CHECK_FAKE_NO_GPU} 1)
run(77 "no NVIDIA GPU found here" --build-dir ${WORK_DIR} --quick)
run(77 "the script is ready" --build-dir ${WORK_DIR})
message("scripts/gpu-check: help, argument errors and the no-GPU path behave")
