# SPDX-License-Identifier: Apache-2.0
# --conv winograd against --conv direct: PROGRAM (the resnet example's ResNet-20, whose 32- and
# 64-channel 3x3 convolutions Winograd suits) trains 6 steps from the same seed with each. Both
# runs finish with a result line, and their training losses agree within 0.5% (Winograd rounds
# differently, by about 1e-6 of a convolution's largest output: tests/layers checks which kernels
# run and their error against a double reference).
include(${CMAKE_CURRENT_LIST_DIR}/losses.cmake)
foreach(conv direct winograd)
  run_for_loss(${conv} ${PROGRAM} --model resnet20 --max-steps 6 --train-samples 384 --test-samples 128 --batch 64
               --threads 1 --seed 3 --conv ${conv} --quiet)
  if(NOT ${conv}_rc EQUAL 0)
    message(FATAL_ERROR "the --conv ${conv} run failed (${${conv}_rc})")
  endif()
endforeach()
message("train_loss: direct ${direct_loss}, winograd ${winograd_loss}")
losses_within(near "${direct_loss}" "${winograd_loss}" 200)  # within 0.5%
if(NOT near)
  message(FATAL_ERROR "the Winograd run's loss ${winograd_loss} is more than 0.5% from the direct run's ${direct_loss}")
endif()
