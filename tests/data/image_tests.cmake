# SPDX-License-Identifier: Apache-2.0
# The image tests, included by tests/data/CMakeLists.txt: decoding (image_decode_test), pipelines
# (image_pipeline_test), decoding threads (image_pool_test) and fuzzing (image_fuzz_test), in one
# binary, test_data_images, built with the loom::images component. TurboJPEG encodes their JPEGs
# and is their reference decoder (Debian: libturbojpeg0-dev); zlib writes a PNG checksum.
# Cases that need what the machine may lack (Pillow, torchvision's environment from
# benchmarks/data/make_venv.sh) exit with 77 there: reported as skipped.
if(NOT TARGET loom::images)
  message(STATUS "loom: the image tests are not built: loom::images is off (LOOM_WITH_IMAGES)")
  return()
endif()
find_package(PkgConfig REQUIRED)
find_package(ZLIB REQUIRED)
if(NOT TARGET PkgConfig::LOOM_TEST_TURBOJPEG)
  pkg_check_modules(LOOM_TEST_TURBOJPEG QUIET IMPORTED_TARGET libturbojpeg)
endif()
if(NOT TARGET PkgConfig::LOOM_TEST_TURBOJPEG)
  message(FATAL_ERROR "loom's image tests need TurboJPEG (libturbojpeg.pc; Debian package: libturbojpeg0-dev), "
                      "or configure with -DLOOM_WITH_IMAGES=OFF")
endif()
add_executable(test_data_images
  ${CMAKE_CURRENT_LIST_DIR}/image_main.cpp
  ${CMAKE_CURRENT_LIST_DIR}/image_decode_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/image_pipeline_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/image_pool_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/image_fuzz_test.cpp)
target_link_libraries(test_data_images PRIVATE loom::images Catch2::Catch2 PkgConfig::LOOM_TEST_TURBOJPEG ZLIB::ZLIB)
target_include_directories(test_data_images PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../support)
target_compile_options(test_data_images PRIVATE -Wall -Wextra -Wpedantic)
catch_discover_tests(test_data_images PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2" SKIP_RETURN_CODE 77)
