// SPDX-License-Identifier: Apache-2.0
#pragma once
// Everything for feeding data to training: the IDX reader, in-memory labelled image sets with
// the MNIST and Fashion-MNIST loaders, and the seeded shuffling batch loader.

#include "loom/data/dataset.hpp"
#include "loom/data/idx.hpp"
#include "loom/data/loader.hpp"
