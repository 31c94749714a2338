// SPDX-License-Identifier: Apache-2.0
// A machine without oneDNN (LOOM_HAS_DNNL defined 0, as default_backend.hpp would find it): a
// trainer on the default backend says what to install, not "incomplete type loom::cpu".
// expect: loom::cpu, the default backend of loom::model and loom::trainer, needs oneDNN
// expect: install libdnnl-dev
#define LOOM_HAS_DNNL 0
#include "loom/loom.hpp"

using net = loom::network<loom::input<784>, loom::linear<10>>;

int main() {
  loom::trainer<net, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.1f}};
  (void)t;
}
