// SPDX-License-Identifier: Apache-2.0
// A network whose first type is not loom::input<...> (a shape, and a bare layer list).
// expect: loom::network's first type must be loom::input<D...>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/model.hpp"

using shape_first = loom::network<loom::shape<4>, loom::linear<3>>;
using layer_first = loom::network<loom::linear<4>, loom::relu, loom::linear<3>>;

int main() {
  loom::model<shape_first, float> a(1);
  loom::model<layer_first, float> b(1);
  return static_cast<int>(a.parameters().size() + b.parameters().size());
}
