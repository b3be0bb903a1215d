// Integers read from JSON that a file or a peer wrote, without undefined behaviour: nlohmann's
// get<int>() converts a float (1e300, NaN) or an out-of-range integer with a plain cast, which is
// undefined for floats. JsonInt accepts only a JSON integer within T's range and throws
// std::invalid_argument / std::out_of_range otherwise (JsonIntAt: std::runtime_error naming the
// key), which the readers' try blocks report as corruption naming the record.
//
// Thread-safety: pure functions.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace atl {

template <typename T, typename Json>
T JsonInt(const Json& v) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.template get<uint64_t>();
    if (std::cmp_greater(u, std::numeric_limits<T>::max()))
      throw std::out_of_range(fmt::format("{} is out of range", u));
    return static_cast<T>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.template get<int64_t>();
    if (std::cmp_less(i, std::numeric_limits<T>::min()) ||
        std::cmp_greater(i, std::numeric_limits<T>::max()))
      throw std::out_of_range(fmt::format("{} is out of range", i));
    return static_cast<T>(i);
  }
  throw std::invalid_argument(fmt::format("expected an integer, found a {}", v.type_name()));
}

// j[key] as JsonInt<T>; every failure (a missing key too, nlohmann's exception) is a
// std::runtime_error naming the key.
template <typename T, typename Json>
T JsonIntAt(const Json& j, const char* key) {
  try {
    return JsonInt<T>(j.at(key));
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: {}", key, e.what()));
  }
}

}  // namespace atl
