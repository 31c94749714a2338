# SPDX-License-Identifier: Apache-2.0
# --math bf16 against --math fp32: PROGRAM (the resnet example's ResNet-20) trains 6 steps from the
# same seed in each. The bf16 run's training loss is near the fp32 one (within 5%) but not equal
# to it (bf16 products ran). Where the CPU has no bf16 the run is refused with a sentence, and
# the test reports Skipped (SKIP_REGULAR_EXPRESSION "loom-test-skip"); the refusal itself is
# examples.math.bf16_refused.
include(${CMAKE_CURRENT_LIST_DIR}/losses.cmake)
foreach(math fp32 bf16)
  run_for_loss(${math} ${PROGRAM} --model resnet20 --max-steps 6 --train-samples 384 --test-samples 128 --batch 64
               --threads 1 --seed 3 --math ${math} --quiet)
  if(NOT ${math}_rc EQUAL 0)
    if(math STREQUAL "bf16" AND ${math}_err MATCHES "math_mode::bf16 is not available")
      message("loom-test-skip: this CPU has no bf16 products")
      return()
    endif()
    message(FATAL_ERROR "the --math ${math} run failed (${${math}_rc})")
  endif()
endforeach()
message("train_loss: fp32 ${fp32_loss}, bf16 ${bf16_loss}")
if(fp32_loss STREQUAL bf16_loss)
  message(FATAL_ERROR "the bf16 run's loss is the fp32 run's to the 4 digits printed: bf16 did not run")
endif()
losses_within(near "${fp32_loss}" "${bf16_loss}" 20)  # within 5%
if(NOT near)
  message(FATAL_ERROR "the bf16 run's loss ${bf16_loss} is more than 5% from the fp32 run's ${fp32_loss}")
endif()
