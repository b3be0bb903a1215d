#include "core/status.h"

#include <cstdio>

namespace atl {

namespace {
const char* CodeName(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kCorruption: return "corruption";
    case StatusCode::kIoError: return "io error";
    case StatusCode::kInternal: return "internal error";
    case StatusCode::kUnavailable: return "unavailable";
  }
  return "unknown";
}
}  // namespace

std::string Status::ToString() const {
  if (ok()) return "ok";
  return fmt::format("{}: {}", CodeName(code_), message_);
}

int Status::ExitCode() const {
  switch (code_) {
    case StatusCode::kOk: return 0;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorruption: return 2;
    default: return 1;
  }
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

void ExitIfError(const Status& s) {
  if (s.ok()) return;
  std::fprintf(stderr, "atoll: error: %s\n", s.ToString().c_str());
  std::exit(s.ExitCode());
}

}  // namespace atl
