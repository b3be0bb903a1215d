// Status and StatusOr: errors as values (LevelDB style).
//
// Every fallible operation that crosses a trust boundary (a file, a config, an argument, a
// network message) returns a Status that says what was being done, on what, and what was
// expected. The CLI maps codes to exit codes: bad input (config, data, checkpoint, arguments)
// exits with 2, runtime failures with 1.
//
// Thread-safety: values; safe to copy between threads.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace atl {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad config, argument or value: user error
  kNotFound,         // a named file, key or tensor does not exist
  kCorruption,       // a file or message failed validation (checksum, size, format)
  kIoError,          // the operating system refused a read or write
  kInternal,         // a bug or an unexpected runtime failure
  kUnavailable,      // a peer or service could not be reached
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status Corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  static Status IoError(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "corruption: model.safetensors: tensor h.0.attn.c_attn.weight checksum mismatch"
  std::string ToString() const;

  // 0 for ok, 2 for bad input (invalid argument, not found, corruption), 1 otherwise.
  int ExitCode() const;

  // Prefixes the message with context: Status::NotFound("x").WithContext("loading config")
  // gives "loading config: x". No-op on ok.
  Status WithContext(const std::string& context) const;

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or the error that prevented computing it.
template <class T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status::Internal("StatusOr constructed from an ok Status");
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  // REQUIRES: ok()
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

// Prints the status to stderr and exits with its exit code if it is an error.
void ExitIfError(const Status& s);

}  // namespace atl

#define ATOLL_CONCAT_INNER_(a, b) a##b
#define ATOLL_CONCAT_(a, b) ATOLL_CONCAT_INNER_(a, b)

#define ATOLL_RETURN_IF_ERROR(expr)              \
  do {                                           \
    ::atl::Status _atoll_st = (expr);          \
    if (!_atoll_st.ok()) return _atoll_st;       \
  } while (0)

#define ATOLL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#define ATOLL_ASSIGN_OR_RETURN(lhs, expr) \
  ATOLL_ASSIGN_OR_RETURN_IMPL_(ATOLL_CONCAT_(_atoll_so_, __LINE__), lhs, expr)
