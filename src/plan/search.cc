#include "plan/search.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <unordered_map>

namespace atl::plan {
namespace {

// Divisors of n, ascending, by trial division (our numbers are smooth: products of small primes).
const std::vector<int64_t>& Divisors(int64_t n) {
  thread_local std::unordered_map<int64_t, std::vector<int64_t>> cache;
  auto it = cache.find(n);
  if (it != cache.end()) return it->second;
  std::vector<std::pair<int64_t, int>> primes;
  int64_t m = n;
  for (int64_t p = 2; p * p <= m; p += (p == 2 ? 1 : 2)) {
    int e = 0;
    while (m % p == 0) {
      m /= p;
      ++e;
    }
    if (e > 0) primes.push_back({p, e});
  }
  if (m > 1) primes.push_back({m, 1});
  std::vector<int64_t> d = {1};
  for (auto [p, e] : primes) {
    size_t count = d.size();
    int64_t pk = 1;
    for (int k = 1; k <= e; ++k) {
      pk *= p;
      for (size_t i = 0; i < count; ++i) d.push_back(d[i] * pk);
    }
  }
  std::sort(d.begin(), d.end());
  return cache.emplace(n, std::move(d)).first->second;
}

// Ordered factorizations of n into 5 factors (dp, tp_model, tp_ff, pp, ep).
const std::vector<std::array<int64_t, 5>>& FiveWay(int64_t n) {
  thread_local std::unordered_map<int64_t, std::vector<std::array<int64_t, 5>>> cache;
  auto it = cache.find(n);
  if (it != cache.end()) return it->second;
  std::vector<std::array<int64_t, 5>> out;
  std::array<int64_t, 5> cur{};
  auto rec = [&](auto&& self, int k, int64_t rest) -> void {
    if (k == 4) {
      cur[4] = rest;
      out.push_back(cur);
      return;
    }
    for (int64_t d : Divisors(rest)) {
      cur[k] = d;
      self(self, k + 1, rest / d);
    }
  };
  rec(rec, 0, n);
  return cache.emplace(n, std::move(out)).first->second;
}

int64_t ISqrt(int64_t n) {
  int64_t r = static_cast<int64_t>(std::sqrt(static_cast<double>(n)));
  while (r * r > n) --r;
  while ((r + 1) * (r + 1) <= n) ++r;
  return r;
}

struct Candidate {
  double bound_s;
  int64_t dp, tpm, tpf, pp, ep, microbatches, interleave;
  double matmul_pair_s;
  bool zero_bubble;
};

// Total degrees -> per-level splits of the site levels (reference: parallelism_partitions).
// Level l < last takes a 5-way factorization of its size (capped once the cluster fits in it);
// the outermost site level takes what remains.
void ForEachPlacement(const Topology& topo, const std::array<int64_t, 5>& total,
                      const std::vector<int64_t>& outer_dp,
                      const std::function<void(const Layout&)>& visit) {
  const size_t site = topo.site_levels;
  const size_t levels = topo.levels.size();
  int64_t gpus = total[0] * total[1] * total[2] * total[3] * total[4];
  std::vector<int64_t> sizes;
  int64_t running = 1;
  bool capped = false;
  for (size_t l = 0; l + 1 < site; ++l) {
    if (capped) {
      sizes.push_back(1);
      continue;
    }
    running *= topo.levels[l].size;
    if (running < gpus) {
      sizes.push_back(topo.levels[l].size);
    } else {
      sizes.push_back(gpus / (running / topo.levels[l].size));
      capped = true;
    }
  }
  Layout layout;
  for (auto* v : {&layout.dp, &layout.tp_model, &layout.tp_ff, &layout.pp, &layout.ep}) {
    v->assign(levels, 1);
  }
  for (size_t l = site; l < levels; ++l) layout.dp[l] = outer_dp[l - site];
  std::array<int64_t, 5> rest = total;
  auto rec = [&](auto&& self, size_t l) -> void {
    if (l + 1 == site || sizes.empty()) {
      layout.dp[site - 1] = rest[0];
      layout.tp_model[site - 1] = rest[1];
      layout.tp_ff[site - 1] = rest[2];
      layout.pp[site - 1] = rest[3];
      layout.ep[site - 1] = rest[4];
      visit(layout);
      return;
    }
    for (const auto& f : FiveWay(sizes[l])) {
      bool ok = true;
      for (int k = 0; k < 5 && ok; ++k) ok = rest[k] % f[k] == 0;
      if (!ok) continue;
      std::array<int64_t, 5> saved = rest;
      for (int k = 0; k < 5; ++k) rest[k] /= f[k];
      layout.dp[l] = f[0];
      layout.tp_model[l] = f[1];
      layout.tp_ff[l] = f[2];
      layout.pp[l] = f[3];
      layout.ep[l] = f[4];
      self(self, l + 1);
      rest = saved;
    }
  };
  rec(rec, 0);
}

}  // namespace

double LatencyFloorSeconds(const Gpu& gpu, const ModelShape& shape) {
  return shape.steps() * 6.0 * static_cast<double>(shape.layers) * gpu.latency_per_matmul_s;
}

std::optional<PlanResult> BestLayout(const Gpu& gpu, const Topology& topo, const ModelShape& shape,
                                     int64_t site_gpus, const std::vector<int64_t>& outer_dp,
                                     const SearchOptions& options) {
  int64_t outer = 1;
  for (int64_t d : outer_dp) outer *= d;
  if (site_gpus < 1 || outer < 1) return std::nullopt;
  const int64_t ep = std::gcd(site_gpus, shape.experts);
  const int64_t rest = site_gpus / ep;
  const int64_t width = shape.d_model * shape.d_ff;
  const int64_t batch = shape.batch_tokens();
  if (batch % outer != 0) return std::nullopt;
  const int64_t site_batch = batch / outer;

  Topology optimistic = OptimisticTopology(topo);
  // With the reference's combination the levels' bandwidth times overlap, so its bound is the
  // reference's: one level with the sum of the levels' bandwidths.
  if (options.eval.combine == Combine::kReference) {
    double sum = 0;
    for (const auto& l : topo.levels) sum += l.bandwidth;
    if (!topo.levels.empty()) optimistic.levels[0].bandwidth = sum;
  }
  int min_bits = gpu.bits;
  for (const auto& l : topo.levels)
    min_bits = std::min(min_bits, l.wire_bits > 0 ? l.wire_bits : gpu.bits);
  optimistic.levels[0].wire_bits = min_bits;

  std::map<std::array<int64_t, 3>, double> matmul_cache;
  std::vector<Candidate> candidates;
  for (int64_t tp : Divisors(std::gcd(rest, width))) {
    for (int64_t dp : Divisors(std::gcd(rest / tp, site_batch))) {
      int64_t pp = rest / tp / dp;
      if (shape.layers % pp != 0) continue;
      int64_t root = ISqrt(tp);
      for (int64_t tpf : Divisors(tp)) {
        if (tpf < root || tpf > 4 * root) continue;
        int64_t tpm = tp / tpf;
        if (shape.d_model % tpm != 0 || shape.d_ff % tpf != 0) continue;
        int64_t per_replica = batch / (shape.experts * dp * outer);
        if (per_replica < 1) continue;
        const auto& divs = Divisors(per_replica);
        // The configured schedule, or both. atoll: the fewest microbatches that fill it. The
        // reference's search (with its combination): interleaved 1F1B with each of the 4 fewest
        // microbatch counts >= PP, zero bubble with the fewest >= 2 PP.
        const bool reference = options.eval.combine == Combine::kReference;
        const std::vector<bool> schedules = options.both_schedules
                                                ? std::vector<bool>{false, true}
                                                : std::vector<bool>{options.zero_bubble};
        for (const bool zb : schedules) {
          const int64_t need = zb ? (reference ? 2 * pp : 2 * pp - 1) : pp;
          auto first = std::lower_bound(divs.begin(), divs.end(), need);
          const size_t counts = reference && !zb ? 4 : 1;
          for (auto mb = first; mb != divs.end() && size_t(mb - first) < counts; ++mb) {
            Layout flat;
            flat.dp = {dp * outer};
            flat.tp_model = {tpm};
            flat.tp_ff = {tpf};
            flat.pp = {pp};
            flat.ep = {ep};
            flat.microbatches = *mb;
            flat.zero_bubble = zb;
            flat.interleave = (options.interleaving && !zb && pp > 1) ? shape.layers / pp : 1;
            // Memory is checked per site: one flat site level holds the same totals.
            Layout site_flat = flat;
            site_flat.dp = {dp};
            Topology one_site;
            one_site.levels = {optimistic.levels[0]};
            one_site.site_levels = 1;
            if (!FitsInMemory(gpu, one_site, shape, site_flat)) continue;
            std::array<int64_t, 3> key = {shape.d_ff / tpf, shape.d_model / tpm,
                                          MicrobatchTokens(shape, flat)};
            auto [it, inserted] = matmul_cache.try_emplace(key, 0.0);
            if (inserted)
              it->second =
                  MatmulPairSeconds(gpu, shape, flat, options.eval.combine == Combine::kReference);
            StepTime bound =
                EvaluateStepWithMatmul(gpu, optimistic, shape, flat, options.eval, it->second);
            candidates.push_back({bound.step_s, dp, tpm, tpf, pp, ep, flat.microbatches,
                                  flat.interleave, it->second, zb});
          }
        }
      }
    }
  }
  if (candidates.empty()) return std::nullopt;
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.bound_s < b.bound_s; });

  std::optional<PlanResult> best;
  double best_comm = 0;
  for (const Candidate& c : candidates) {
    if (best && c.bound_s > best->step.step_s) break;
    std::array<int64_t, 5> total = {c.dp, c.tpm, c.tpf, c.pp, c.ep};
    ForEachPlacement(topo, total, outer_dp, [&](const Layout& placed) {
      Layout l = placed;
      l.microbatches = c.microbatches;
      l.interleave = c.interleave;
      l.zero_bubble = c.zero_bubble;
      StepTime t = EvaluateStepWithMatmul(gpu, topo, shape, l, options.eval, c.matmul_pair_s);
      // Faster wins; at equal time, less communication (reference tie-break).
      if (!best || t.step_s < best->step.step_s ||
          (t.step_s == best->step.step_s && t.comm_s() < best_comm)) {
        best = PlanResult{l, t, t.step_s * shape.steps()};
        best_comm = t.comm_s();
      }
    });
  }
  return best;
}

std::optional<PlanResult> SmallestSite(
    const Gpu& gpu, const ModelShape& shape, double time_limit_s, int64_t outer,
    const std::function<std::optional<PlanResult>(int64_t site_gpus)>& best_for_site) {
  if (LatencyFloorSeconds(gpu, shape) >= time_limit_s) return std::nullopt;
  // A run can never be faster than all its GPUs doing matmul arithmetic at the derated peak.
  const double work_s = 6.0 * shape.active_params * shape.tokens / gpu.flop_per_s();
  // Parallelism cannot exceed TP x DP x PP x EP capacity; beyond it no layout exists.
  const double capacity = static_cast<double>(shape.d_model) * static_cast<double>(shape.d_ff) *
                          static_cast<double>(shape.batch_tokens()) *
                          static_cast<double>(shape.layers) * static_cast<double>(shape.experts);
  for (int i = 0; i < 60; ++i) {
    double site = static_cast<double>(shape.experts) * std::ldexp(1.0, i);
    if (site * static_cast<double>(outer) > capacity) break;
    if (work_s / (site * static_cast<double>(outer)) >= time_limit_s) continue;
    auto r = best_for_site(static_cast<int64_t>(site));
    if (r && r->train_s < time_limit_s) return r;
  }
  return std::nullopt;
}

std::optional<PlanResult> SmallestCluster(const Gpu& gpu, const Topology& topo,
                                          const ModelShape& shape, double time_limit_s,
                                          const std::vector<int64_t>& outer_dp,
                                          const SearchOptions& options) {
  int64_t outer = 1;
  for (int64_t d : outer_dp) outer *= d;
  return SmallestSite(gpu, shape, time_limit_s, outer, [&](int64_t site) {
    return BestLayout(gpu, topo, shape, site, outer_dp, options);
  });
}

std::string DescribeLayout(const Layout& l) {
  std::string s = fmt::format("TP {}x{} PP {}", l.TPModel(), l.TPFF(), l.PP());
  if (l.interleave > 1) s += fmt::format(" (v{})", l.interleave);
  s += fmt::format(" DP {}", l.DP());
  if (l.EP() > 1) s += fmt::format(" EP {}", l.EP());
  s += fmt::format(" m{}", l.microbatches);
  return s;
}

std::string DescribePlacement(const Layout& l, const Topology& topo) {
  std::string out;
  for (size_t i = 0; i < topo.levels.size(); ++i) {
    std::string part;
    auto add = [&](const char* what, int64_t v) {
      if (v > 1) part += fmt::format("{}{} {}", part.empty() ? "" : " ", what, v);
    };
    add("DP", l.dp[i]);
    add("TPm", l.tp_model[i]);
    add("TPff", l.tp_ff[i]);
    add("PP", l.pp[i]);
    add("EP", l.ep[i]);
    if (part.empty()) continue;
    out += fmt::format("{}{}: {}", out.empty() ? "" : " | ", topo.levels[i].name, part);
  }
  return out.empty() ? "single GPU" : out;
}

}  // namespace atl::plan
