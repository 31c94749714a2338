# SPDX-License-Identifier: Apache-2.0
# Runs SCRIPT with PYTHON and ARGS (a |-separated list); a missing Python environment is a failure that
# says how to make it, never a skip.
if(NOT EXISTS "${PYTHON}")
  message(FATAL_ERROR "the io tests' Python environment is missing (${PYTHON} does not exist): run "
                      "`bash scripts/setup` in loom's source directory to make it (a venv with onnx, onnxruntime, "
                      "safetensors and Debian's python3-torch)")
endif()
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" ${args} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${SCRIPT} failed (exit status ${rc})")
endif()
