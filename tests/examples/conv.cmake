# SPDX-License-Identifier: Apache-2.0
# --conv winograd against --conv direct: PROGRAM (the resnet example's ResNet-20, whose 32- and
# 64-channel 3x3 convolutions Winograd suits) trains 6 steps from the same seed with each. Both
# runs finish with a result line, and their training losses agree within 0.5% (Winograd rounds
# differently, by about 1e-6 of a convolution's largest output: tests/layers checks which kernels
# run and their error against a double reference).
foreach(conv direct winograd)
  execute_process(COMMAND ${PROGRAM} --model resnet20 --max-steps 6 --train-samples 384 --test-samples 128 --batch 64
                          --threads 1 --seed 3 --conv ${conv} --quiet
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 200)
  message("--conv ${conv}: exit status ${rc}\n--- stdout\n${out}--- stderr\n${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the --conv ${conv} run failed (${rc})")
  endif()
  if(NOT out MATCHES "train_loss=([0-9.]+)")
    message(FATAL_ERROR "no train_loss= in the --conv ${conv} run's result line")
  endif()
  set(loss_${conv} "${CMAKE_MATCH_1}")
endforeach()
message("train_loss: direct ${loss_direct}, winograd ${loss_winograd}")
# |winograd - direct| < 0.005 direct, in units of the 4th decimal printed
string(REGEX REPLACE "\\." "" a "${loss_direct}")
string(REGEX REPLACE "\\." "" b "${loss_winograd}")
string(REGEX REPLACE "^0+([0-9])" "\\1" a "${a}")
string(REGEX REPLACE "^0+([0-9])" "\\1" b "${b}")
math(EXPR diff "${a} - ${b}")
if(diff LESS 0)
  math(EXPR diff "0 - ${diff}")
endif()
math(EXPR limit "${a} / 200")
if(NOT diff LESS limit)
  message(FATAL_ERROR "the Winograd run's loss ${loss_winograd} is more than 0.5% from the direct run's ${loss_direct}")
endif()
