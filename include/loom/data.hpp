// SPDX-License-Identifier: Apache-2.0
#pragma once
// Everything for feeding data to training: the IDX reader, labelled image sets in memory or
// memory-mapped (MNIST, Fashion-MNIST), the seeded shuffling batch loader and the distributed
// sampler that gives each rank its share of every batch.

#include "loom/data/dataset.hpp"
#include "loom/data/distributed.hpp"
#include "loom/data/idx.hpp"
#include "loom/data/loader.hpp"
#include "loom/data/mapped.hpp"
