// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::any_optimizer: the optimizer chosen at run time among loom's own (sgd, adam, adamw),
// for a program that takes it from a flag or a configuration file. One trainer type then
// serves every choice, so the program compiles the trainer once instead of once per optimizer.
// The arithmetic, the checks and the messages are the chosen optimizer's own; a run with
// any_optimizer holding sgd's options is bitwise a run of loom::sgd, and its checkpoints name
// "sgd" (either trainer resumes the other's).

#include <cstddef>
#include <charconv>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "loom/optim/adam.hpp"
#include "loom/optim/sgd.hpp"

namespace loom {

namespace detail {
/// The optimizer whose options are O (loom::sgd, adam or adamw).
template <class O>
struct optimizer_of;
template <>
struct optimizer_of<sgd::options> {
  using type = sgd;
};
template <>
struct optimizer_of<adam::options> {
  using type = adam;
};
template <>
struct optimizer_of<adamw::options> {
  using type = adamw;
};
template <class O>
using optimizer_of_t = typename optimizer_of<std::remove_cvref_t<O>>::type;
}  // namespace detail

/// One of loom::sgd, loom::adam and loom::adamw, chosen by the options it is given:
///   loom::trainer<Net, Loss, loom::any_optimizer> t{loom::adam::options{.lr = 1e-3f}};
/// options() without an argument is loom::sgd's defaults.
struct any_optimizer {
  /// The chosen optimizer's options (implicitly from each of them).
  class options {
   public:
    constexpr options() = default;
    // Implicit, so that `trainer t{loom::adam::options{...}}` reads as it means.
    constexpr options(const sgd::options& o) : chosen_(o) {}
    constexpr options(const adam::options& o) : chosen_(o) {}
    constexpr options(const adamw::options& o) : chosen_(o) {}

    /// The chosen optimizer's name ("sgd", "adam", "adamw"), as checkpoints record it.
    constexpr const char* name() const noexcept {
      return std::visit([](const auto& o) { return detail::optimizer_of_t<decltype(o)>::name; }, chosen_);
    }
    /// Its base learning rate.
    constexpr float lr() const noexcept {
      return std::visit([](const auto& o) { return o.lr; }, chosen_);
    }
    /// Its decay_norm_and_bias (false: no weight decay on norm layers and biases).
    constexpr bool decay_norm_and_bias() const noexcept {
      return std::visit([](const auto& o) { return o.decay_norm_and_bias; }, chosen_);
    }
    /// Its options, when Optimizer (sgd, adam or adamw) is the one chosen; null otherwise.
    template <class Optimizer>
    const typename Optimizer::options* get_if() const noexcept {
      return std::get_if<typename Optimizer::options>(&chosen_);
    }
    /// f(o) with the chosen optimizer's options o.
    template <class F>
    constexpr decltype(auto) visit(F&& f) const {
      return std::visit(std::forward<F>(f), chosen_);
    }

   private:
    std::variant<sgd::options, adam::options, adamw::options> chosen_;
  };

  /// Names of the chosen optimizer's state buffers (Optimizer::buffer_names), as many as
  /// buffer_count(o).
  static constexpr std::span<const char* const> buffer_names(const options& o) noexcept {
    return o.visit([](const auto& x) -> std::span<const char* const> {
      return detail::optimizer_of_t<decltype(x)>::buffer_names;
    });
  }
  /// Values of state per parameter the chosen optimizer keeps (loom::memory_plan counts by it).
  static constexpr std::size_t state_values_per_parameter(const options& o) noexcept {
    return o.visit([](const auto& x) {
      return detail::optimizer_of_t<decltype(x)>::state_values_per_parameter(x);
    });
  }

  /// The chosen optimizer's state (sgd::state, adam::state or adamw::state) behind the same
  /// interface; each call goes to it.
  template <class T, class Backend>
  class state {
   public:
    /// Checks o and allocates as the chosen optimizer's state does (the same messages).
    state(const options& o, std::size_t n) : opts_(o), state_(make(o, n)) {}

    // (Defined below the class, not inline: where loom::compiled holds this state's
    // instantiation, a program compiles none of the three optimizers' steps.)
    void step(T* params, const T* grads, std::size_t n, float lr);
    void step_part(T* params, const T* grads, std::size_t offset, std::size_t n, float lr);
    void end_step() noexcept {
      std::visit([](auto& s) { s.end_step(); }, state_);
    }
    const options& opts() const noexcept { return opts_; }
    std::span<T> buffers() noexcept {
      return std::visit([](auto& s) { return s.buffers(); }, state_);
    }
    std::span<const T> buffers() const noexcept {
      return std::visit([](const auto& s) { return s.buffers(); }, state_);
    }
    std::size_t steps() const noexcept {
      return std::visit([](const auto& s) { return s.steps(); }, state_);
    }
    void set_steps(std::size_t s) noexcept {
      std::visit([&](auto& x) { x.set_steps(s); }, state_);
    }
    void set_decay_exempt(std::vector<index_range> ranges) {
      std::visit([&](auto& x) { x.set_decay_exempt(std::move(ranges)); }, state_);
    }
    const std::vector<index_range>& decay_exempt() const noexcept {
      return std::visit([](const auto& x) -> const std::vector<index_range>& { return x.decay_exempt(); }, state_);
    }

   private:
    using held = std::variant<sgd::state<T, Backend>, adam::state<T, Backend>, adamw::state<T, Backend>>;
    static held make(const options& o, std::size_t n) {
      return o.visit([&](const auto& x) -> held {
        using chosen = detail::optimizer_of_t<decltype(x)>;
        return held(std::in_place_type<typename chosen::template state<T, Backend>>, x, n);
      });
    }
    options opts_;
    held state_;
  };
};

template <class T, class Backend>
void any_optimizer::state<T, Backend>::step(T* params, const T* grads, std::size_t n, float lr) {
  std::visit([&](auto& s) { s.step(params, grads, n, lr); }, state_);
}
template <class T, class Backend>
void any_optimizer::state<T, Backend>::step_part(T* params, const T* grads, std::size_t offset, std::size_t n,
                                                 float lr) {
  std::visit([&](auto& s) { s.step_part(params, grads, offset, n, lr); }, state_);
}

namespace detail {
/// What the trainer asks of an optimizer whatever it is: its name, its base learning rate and
/// its buffers' names, from Optimizer's static members or, for loom::any_optimizer, from the
/// options it was given.
template <class Optimizer>
constexpr const char* optimizer_name(const typename Optimizer::options& o) noexcept {
  if constexpr (requires { o.name(); }) return o.name();
  else return Optimizer::name;
}
template <class Optimizer>
constexpr float base_lr(const typename Optimizer::options& o) noexcept {
  if constexpr (requires { o.lr(); }) return o.lr();
  else return o.lr;
}
template <class Optimizer>
constexpr std::span<const char* const> optimizer_buffer_names(const typename Optimizer::options& o) noexcept {
  if constexpr (requires { Optimizer::buffer_names(o); }) return Optimizer::buffer_names(o);
  else return Optimizer::buffer_names;
}

/// "name=value" with the shortest decimal that reads back as the same float (0.05f: "0.05").
inline std::string option_text(const char* name, float v) {
  char b[32];
  const auto end = std::to_chars(b, b + sizeof b, v).ptr;
  return std::string(name) + "=" + std::string(b, end);
}
/// Every option of loom's optimizers, as a checkpoint records them (checkpoint.json's
/// "optimizer_options": "lr=0.02,momentum=0.9,nesterov=0,weight_decay=0,decay_norm_and_bias=1").
inline std::string options_text(const sgd::options& o) {
  return option_text("lr", o.lr) + "," + option_text("momentum", o.momentum) + ",nesterov=" + (o.nesterov ? "1" : "0") +
         "," + option_text("weight_decay", o.weight_decay) + ",decay_norm_and_bias=" + (o.decay_norm_and_bias ? "1" : "0");
}
inline std::string options_text(const adam::options& o) {
  return option_text("lr", o.lr) + "," + option_text("beta1", o.beta1) + "," + option_text("beta2", o.beta2) + "," +
         option_text("eps", o.eps) + "," + option_text("weight_decay", o.weight_decay) +
         ",decay_norm_and_bias=" + (o.decay_norm_and_bias ? "1" : "0");
}
inline std::string options_text(const adamw::options& o) {
  return options_text(adam::options{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.decay_norm_and_bias});
}
/// Whether options o ask for no weight decay on norm layers and biases (loom's optimizers'
/// decay_norm_and_bias = false); false for an optimizer without the option.
template <class O>
constexpr bool skips_norm_and_bias_decay(const O& o) noexcept {
  if constexpr (requires { o.decay_norm_and_bias(); }) return !o.decay_norm_and_bias();
  else if constexpr (requires { o.decay_norm_and_bias; }) return !o.decay_norm_and_bias;
  else return false;
}
inline std::string options_text(const any_optimizer::options& o) {
  return o.visit([](const auto& chosen) { return options_text(chosen); });
}
/// The options of Optimizer as text: every option of loom's optimizers, the base learning rate
/// of another.
template <class Optimizer>
std::string optimizer_options_text(const typename Optimizer::options& o) {
  if constexpr (requires { options_text(o); }) return options_text(o);
  else return option_text("lr", base_lr<Optimizer>(o));
}
}  // namespace detail

}  // namespace loom
