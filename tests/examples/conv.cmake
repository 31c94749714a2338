# SPDX-License-Identifier: Apache-2.0
# --conv auto and --conv winograd against --conv direct: PROGRAM (the resnet example's
# ResNet-20: auto runs its 64-channel 3x3 convolutions by Winograd at batch 64, winograd its 32-
# and 64-channel ones) trains 6 steps from the same seed with each. Every run finishes with a
# result line, and the training losses agree with the direct run's within 0.5% (Winograd rounds
# differently, by about 1e-6 of a convolution's largest output: tests/layers checks which kernels
# run and their error against a double reference).
include(${CMAKE_CURRENT_LIST_DIR}/losses.cmake)
foreach(conv direct auto winograd)
  run_for_loss(${conv} ${PROGRAM} --model resnet20 --max-steps 6 --train-samples 384 --test-samples 128 --batch 64
               --threads 1 --seed 3 --conv ${conv} --quiet)
  if(NOT ${conv}_rc EQUAL 0)
    message(FATAL_ERROR "the --conv ${conv} run failed (${${conv}_rc})")
  endif()
endforeach()
message("train_loss: direct ${direct_loss}, auto ${auto_loss}, winograd ${winograd_loss}")
foreach(conv auto winograd)
  losses_within(near "${direct_loss}" "${${conv}_loss}" 200)  # within 0.5%
  if(NOT near)
    message(FATAL_ERROR "the --conv ${conv} run's loss ${${conv}_loss} is more than 0.5% from the direct run's "
                        "${direct_loss}")
  endif()
endforeach()
