# SPDX-License-Identifier: Apache-2.0
# Runs the main example on 2 ranks with --tensorboard and --metrics-jsonl (a write per step),
# then reads the event files with TensorBoard's own reader (check_tensorboard.py, in the Python
# environment scripts/setup makes) and compares them with the JSON lines.
if(NOT EXISTS "${PYTHON}")
  message(FATAL_ERROR "the tests' Python environment is missing (${PYTHON} does not exist): run `bash scripts/setup` "
                      "in loom's source directory to make it (a venv with tensorboard, onnx, onnxruntime, safetensors)")
endif()
execute_process(COMMAND "${PYTHON}" -c "import tensorboard" RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PYTHON} cannot import tensorboard: run `bash scripts/setup` in loom's source directory "
                      "(it installs tensorboard==2.21.0 in .venv)\n${err}")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -np 2 ${PROGRAM} --max-steps 20
                        --train-samples 1280 --test-samples 200 --threads 1 --quiet --monitor-every 0
                        --metrics-jsonl ${WORK_DIR}/loom.jsonl --tensorboard ${WORK_DIR}/tb
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the example failed (${rc})")
endif()
execute_process(COMMAND "${PYTHON}" ${CHECK} ${WORK_DIR}/tb ${WORK_DIR}/loom 2 20 RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "TensorBoard does not read the event files as written (check_tensorboard.py: ${rc})")
endif()
