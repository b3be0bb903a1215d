// world.balance: how a step's micro-batches are shared among the live sites by their measured
// speed. A pure function of what every site knows alike (the live sites and the seconds per
// micro-batch each measured: sync, in an agreed step's sums; diloco and streaming, in the votes
// of the last merged exchange), so every site computes the same shares. In sync's reproducible
// mode the sums do not depend on who computed which micro-batch, so a run gives the same bits
// whatever the shares (as when the live sites take over a lost site's).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace atl {

// The micro-batches of each live site (in live's order), `total` in all: proportional to
// 1 / seconds[site] (seconds by site index), at least 1 each, the remainder of the rounding to
// the largest fractions (ties: the lower site). Equal shares (the remainder to the lowest sites)
// when a live site has no positive, finite measurement. REQUIRES: total >= live.size() > 0.
std::vector<int64_t> BalancedCounts(std::span<const int> live, std::span<const double> seconds,
                                    int64_t total);

// Site `site`'s part of the sites' shares laid end to end: [from, to) with from the live sites'
// counts before it (live's order); empty when it is not live.
std::vector<std::pair<int64_t, int64_t>> ShareOfSite(std::span<const int> live,
                                                     std::span<const int64_t> counts, int site);

}  // namespace atl
