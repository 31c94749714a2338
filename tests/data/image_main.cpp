// SPDX-License-Identifier: Apache-2.0
// Catch2's main for the image tests (test_data_images). A case whose requirement is missing
// (Pillow, torchvision's environment) exits with 77: CTest reports it skipped.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
