// Included by a .cc file whose floating-point results every machine must round alike (what sites
// of a world compute and then compare or apply, what a replay re-executes): from here on in that
// file, no fused multiply-add contraction, whatever -march the build targets. With contraction,
// a * b + c may become one FMA (one rounding instead of two), so the result would depend on the
// CPU the binary was built for; GCC contracts across statements by default even with
// -std=c++20. Each expression is then evaluated as written, every operation rounded to its type.
// Include it after the other headers (inline code they define is not meant).
#pragma once

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
