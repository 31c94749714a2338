# SPDX-License-Identifier: Apache-2.0
# Runs the main example on 2 ranks with --metrics-file and --metrics-jsonl, then checks each
# rank's textfile with `promtool check metrics` and each JSON line with Python's json module.
find_program(PROMTOOL promtool)
if(NOT PROMTOOL)
  message(FATAL_ERROR "promtool not found: run scripts/setup (it installs Debian's prometheus package)")
endif()
find_program(PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -np 2 ${PROGRAM} --max-steps 20
                        --train-samples 1280 --test-samples 200 --threads 1 --quiet --monitor-every 0
                        --metrics-file ${WORK_DIR}/loom.prom --metrics-jsonl ${WORK_DIR}/loom.jsonl
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the example failed (${rc})")
endif()
foreach(r 0 1)
  set(prom ${WORK_DIR}/loom.rank${r}.prom)
  if(NOT EXISTS ${prom})
    message(FATAL_ERROR "${prom} was not written")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E cat ${prom} COMMAND ${PROMTOOL} check metrics
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("promtool check metrics ${prom}: ${rc} ${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "promtool rejects ${prom}: ${out}${err}")
  endif()
  file(READ ${prom} text)
  if(NOT text MATCHES "loom_steps_total{rank=\"${r}\"} 20\n")
    message(FATAL_ERROR "${prom} does not say 20 steps for rank ${r}:\n${text}")
  endif()
  execute_process(COMMAND ${PYTHON3} -c
    "import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]; assert len(rows)==21, len(rows); assert [r['step'] for r in rows[:20]]==list(range(1,21)); assert all(r['rank']==${r} for r in rows); print('rows', len(rows))"
    ${WORK_DIR}/loom.rank${r}.jsonl RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("json lines rank ${r}: ${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the JSON lines of rank ${r} are not as expected: ${err}")
  endif()
endforeach()
