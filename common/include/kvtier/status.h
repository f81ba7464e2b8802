// kvtier::Status and kvtier::Result<T>: the one error model of kvtier.
//
// Every fallible call returns a Status (or a Result<T> holding a value or a
// non-OK Status). No exception crosses a module boundary. The codes mirror the
// gRPC canonical codes so that the proto layer maps them one to one.
//
// Misuse of a Result (reading the value of an error Result, building a Result
// from an OK Status) aborts the process with a message naming the Status, in
// every build type (NDEBUG included): it is a bug, and going on would read a
// value that is not there.
//
// Thread-safety: value types; safe to copy between threads.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kvtier {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kIOError = 100,  // An I/O call failed (maps to gRPC INTERNAL on the wire).
};

// Returns the upper-case name of `code`, e.g. "INVALID_ARGUMENT".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status PermissionDenied(std::string m) {
    return {StatusCode::kPermissionDenied, std::move(m)};
  }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status DeadlineExceeded(std::string m) {
    return {StatusCode::kDeadlineExceeded, std::move(m)};
  }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  // An I/O error from a failed system call: `what` plus strerror(errnum).
  static Status FromErrno(int errnum, std::string_view what);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE: message", or "OK".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

namespace internal {
// Writes "kvtier: <what> (<status>)" to stderr and aborts. Never returns.
[[noreturn]] void ResultCheckFailed(const char* what, const Status& status);
}  // namespace internal

// A value or a non-OK Status. value(), operator-> and operator* require ok();
// the Status constructor requires a non-OK Status. Both are checked in every
// build type: a violation aborts (see the top of this file).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) [[unlikely]] {
      internal::ResultCheckFailed("Result built from an OK Status has no value",
                                  std::get<Status>(v_));
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    CheckOk();
    return *std::get_if<T>(&v_);
  }
  const T& value() const& {
    CheckOk();
    return *std::get_if<T>(&v_);
  }
  T&& value() && {
    CheckOk();
    return std::move(*std::get_if<T>(&v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void CheckOk() const {
    if (!ok()) [[unlikely]] {
      internal::ResultCheckFailed("value of an error Result", std::get<Status>(v_));
    }
  }

  std::variant<T, Status> v_;
};

}  // namespace kvtier

// Returns early from the enclosing function when `expr` yields a non-OK Status.
#define KVTIER_RETURN_IF_ERROR(expr)         \
  do {                                       \
    ::kvtier::Status _kvtier_st = (expr);    \
    if (!_kvtier_st.ok()) return _kvtier_st; \
  } while (0)
