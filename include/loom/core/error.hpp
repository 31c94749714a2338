// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom's exception hierarchy. Every run-time failure loom reports is a loom::error whose
// message names what failed, where, what was expected and what was found.

#include <stdexcept>
#include <string>

namespace loom {

/// Base of every exception loom throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A file could not be opened, read or written, or its contents are not what they claim.
class io_error : public error {
 public:
  using error::error;
};

/// A data set file is malformed: wrong magic, inconsistent counts, labels out of range.
class data_error : public io_error {
 public:
  using io_error::io_error;
};

/// An argument or option is out of its documented range.
class invalid_argument : public error {
 public:
  using error::error;
};

/// A vendor library (oneDNN, cuBLAS, ...) reported a failure.
class backend_error : public error {
 public:
  using error::error;
};

/// Processes of one job disagree (network type, world size) or a peer failed.
class communication_error : public error {
 public:
  using error::error;
};

}  // namespace loom
