# SPDX-License-Identifier: Apache-2.0
# --math bf16 against --math fp32: PROGRAM (the resnet example's ResNet-20) trains 6 steps from the
# same seed in each. The bf16 run's training loss is near the fp32 one (within 5%) but not equal
# to it (bf16 products ran). Where the CPU has no bf16 the run is refused with a sentence, and
# the test reports Skipped (SKIP_REGULAR_EXPRESSION "loom-test-skip"); the refusal itself is
# examples.math.bf16_refused.
foreach(math fp32 bf16)
  execute_process(COMMAND ${PROGRAM} --model resnet20 --max-steps 6 --train-samples 384 --test-samples 128 --batch 64
                          --threads 1 --seed 3 --math ${math} --quiet
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 200)
  message("--math ${math}: exit status ${rc}\n--- stdout\n${out}--- stderr\n${err}")
  if(NOT rc EQUAL 0)
    if(math STREQUAL "bf16" AND err MATCHES "math_mode::bf16 is not available")
      message("loom-test-skip: this CPU has no bf16 products")
      return()
    endif()
    message(FATAL_ERROR "the --math ${math} run failed (${rc})")
  endif()
  if(NOT out MATCHES "train_loss=([0-9.]+)")
    message(FATAL_ERROR "no train_loss= in the --math ${math} run's result line")
  endif()
  set(loss_${math} "${CMAKE_MATCH_1}")
endforeach()
message("train_loss: fp32 ${loss_fp32}, bf16 ${loss_bf16}")
if(loss_fp32 STREQUAL loss_bf16)
  message(FATAL_ERROR "the bf16 run's loss is the fp32 run's to the 4 digits printed: bf16 did not run")
endif()
# |bf16 - fp32| < 0.05 fp32, in thousandths (the losses are printed with 4 decimals)
string(REGEX REPLACE "\\." "" a "${loss_fp32}")
string(REGEX REPLACE "\\." "" b "${loss_bf16}")
string(REGEX REPLACE "^0+([0-9])" "\\1" a "${a}")
string(REGEX REPLACE "^0+([0-9])" "\\1" b "${b}")
math(EXPR diff "${a} - ${b}")
if(diff LESS 0)
  math(EXPR diff "0 - ${diff}")
endif()
math(EXPR limit "${a} / 20")
if(NOT diff LESS limit)
  message(FATAL_ERROR "the bf16 run's loss ${loss_bf16} is more than 5% from the fp32 run's ${loss_fp32}")
endif()
