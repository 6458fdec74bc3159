#pragma once
// A value or a one-line error message. std::expected is C++23; g++ 12 does not have it.
#include <string>
#include <utility>
#include <variant>

namespace ckpt {

struct Error {
  std::string message;
};

// The message a failure carries when it was given none, so that a failure never reads as success.
inline constexpr const char* kUnknownError = "unknown error";

namespace detail {
inline std::string failure_message(std::string m) { return m.empty() ? std::string(kUnknownError) : std::move(m); }
}  // namespace detail

template <class T>
class Result {
 public:
  Result(T value) : data_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Error error) : data_(Error{detail::failure_message(std::move(error.message))}) {}  // NOLINT: implicit

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

// Result<void>: success or an error message. A failure always has a non-empty message: failure("") carries
// kUnknownError.
class Status {
 public:
  Status() = default;  // success
  static Status success() { return {}; }
  static Status failure(std::string m) { return Status(detail::failure_message(std::move(m))); }
  bool ok() const { return error_message_.empty(); }
  explicit operator bool() const { return ok(); }
  // The error message; empty on success.
  const std::string& error() const { return error_message_; }

 private:
  explicit Status(std::string m) : error_message_(std::move(m)) {}
  std::string error_message_;
};

}  // namespace ckpt
