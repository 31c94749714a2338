# SPDX-License-Identifier: Apache-2.0
# Runs the main example on one rank (REFERENCE, a ';'-list: program then flags) and under
# mpirun (NP ranks of PROGRAM with ARGS), each with --save-weights into WORKDIR, and passes when
# the two weight files are byte for byte the same: the split run ended with the very bits of
# the single-rank run.
function(run_saving file)
  execute_process(COMMAND ${ARGN} --save-weights ${file} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc
                  TIMEOUT 240)
  message("$ ${ARGN} --save-weights ${file}\nexit status: ${rc}\n--- stdout\n${out}--- stderr (last lines)")
  string(LENGTH "${err}" n)
  if(n GREATER 1500)
    math(EXPR from "${n} - 1500")
    string(SUBSTRING "${err}" ${from} -1 err)
  endif()
  message("${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the run failed (${rc})")
  endif()
  if(NOT EXISTS ${file})
    message(FATAL_ERROR "the run wrote no ${file}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORKDIR})
file(MAKE_DIRECTORY ${WORKDIR})
separate_arguments(args UNIX_COMMAND "${ARGS}")
separate_arguments(reference UNIX_COMMAND "${REFERENCE}")
run_saving(${WORKDIR}/one_rank.safetensors ${reference})
run_saving(${WORKDIR}/np${NP}.safetensors ${MPIEXEC} --allow-run-as-root --oversubscribe -np ${NP} ${PROGRAM} ${args})
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORKDIR}/one_rank.safetensors ${WORKDIR}/np${NP}.safetensors
                RESULT_VARIABLE differ)
file(SIZE ${WORKDIR}/one_rank.safetensors size)
if(differ)
  message(FATAL_ERROR "the weights of ${NP} ranks (${WORKDIR}/np${NP}.safetensors) differ from one rank's "
                      "(${WORKDIR}/one_rank.safetensors, ${size} bytes): expected the same bytes")
endif()
message("PASS: the weights of ${NP} ranks and of one rank are the same ${size} bytes")
