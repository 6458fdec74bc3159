#pragma once
// A value or a one-line error message. std::expected is C++23; g++ 12 does not have it.
#include <string>
#include <utility>
#include <variant>

namespace ckpt {

struct Error {
  std::string message;
};

template <class T>
class Result {
 public:
  Result(T value) : data_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Error error) : data_(std::move(error)) {}      // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(data_); }
  explicit operator bool() const { return ok(); }
  const T& value() const& { return std::get<T>(data_); }
  T& value() & { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  const T& operator*() const& { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  // The error message; empty when the result holds a value.
  const std::string& error() const {
    static const std::string none;
    return ok() ? none : std::get<Error>(data_).message;
  }

 private:
  std::variant<T, Error> data_;
};

// Result<void>: success or an error message.
struct Status {
  std::string error_message;
  static Status success() { return {}; }
  static Status failure(std::string m) { return {std::move(m)}; }
  bool ok() const { return error_message.empty(); }
  explicit operator bool() const { return ok(); }
  const std::string& error() const { return error_message; }
};

}  // namespace ckpt
