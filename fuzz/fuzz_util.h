// Helpers shared by the libFuzzer targets (fuzz/*_fuzz.cc): taking parameters off the front of
// the fuzzer's input, and a check that stops the run (a crash the fuzzer records) when a property
// a reader promises does not hold.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace atl::fuzz {

// Reads fixed-size values off the front of the input; past its end they are zero.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  T Take() {
    T v{};
    const size_t n = sizeof(T) < size_ ? sizeof(T) : size_;
    std::memcpy(&v, data_, n);
    data_ += n;
    size_ -= n;
    return v;
  }
  bool Bit() { return Take<uint8_t>() & 1; }
  // What is left, as bytes or text.
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view rest() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  const uint8_t* data_;
  size_t size_;
};

[[noreturn]] inline void Fail(const char* what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: property violated: %s\n", file, line, what);
  std::abort();
}

}  // namespace atl::fuzz

// A property of the reader under test; its failure is a finding, like a crash.
#define FUZZ_CHECK(cond) ((cond) ? (void)0 : ::atl::fuzz::Fail(#cond, __FILE__, __LINE__))
