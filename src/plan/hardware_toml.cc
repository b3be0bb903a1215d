// TOML overrides for the hardware catalogue. Schema (every key optional, unknown keys are errors):
//
//   name = "H100, 1.125 us links"   # label used in reports
//   base_gpu = "H100"               # rebuild from this catalogue GPU first
//   base_network = "default"        # ... with this network variant
//   [gpu]                           # any Gpu field, SI units (bytes, bytes/s, s, Hz, FLOP/s)
//   peak_flops = 9.894e14
//   latency_per_matmul = 4.5e-6
//   [[network]]                     # when present, replaces the whole hierarchy, innermost first
//   name = "NVLink"
//   size = 8                        # GPUs per domain; omit on the outermost level
//   bandwidth = 9e11                # bytes/s per GPU, bidirectional
//   latency = 1.125e-6              # seconds
#include <toml++/toml.h>

#include <cmath>
#include <string>

#include "core/file.h"
#include "plan/hardware.h"

namespace atl::plan {
namespace {

Status Bad(std::string_view origin, const std::string& msg) {
  return Status::InvalidArgument(fmt::format("hardware file {}: {}", origin, msg));
}

// Reads a number (integer or float) into *out.
Status GetNumber(const toml::node& n, std::string_view origin, const std::string& key,
                 double* out) {
  if (auto v = n.value<double>()) {
    *out = *v;
    return Status::Ok();
  }
  return Bad(origin, fmt::format("'{}' must be a number", key));
}

Status ApplyGpuTable(const toml::table& t, std::string_view origin, Gpu* g) {
  for (const auto& [k, node] : t) {
    std::string key(k.str());
    std::string full = "gpu." + key;
    double v = 0;
    if (key == "name") {
      auto s = node.value<std::string>();
      if (!s) return Bad(origin, "'gpu.name' must be a string");
      g->name = *s;
      continue;
    }
    if (key == "distributed_shared_memory") {
      auto b = node.value<bool>();
      if (!b) return Bad(origin, "'gpu.distributed_shared_memory' must be true or false");
      g->distributed_shared_memory = *b;
      continue;
    }
    ATOLL_RETURN_IF_ERROR(GetNumber(node, origin, full, &v));
    if (key == "bits") {
      g->bits = static_cast<int>(v);
    } else if (key == "peak_flops") {
      g->peak_flops = v;
    } else if (key == "effective_utilization") {
      g->effective_utilization = v;
    } else if (key == "num_sms") {
      g->num_sms = static_cast<int>(v);
    } else if (key == "max_clock_hz") {
      g->max_clock_hz = v;
    } else if (key == "register_bytes_per_block") {
      g->register_bytes_per_block = v;
    } else if (key == "l2_bytes") {
      g->l2_bytes = v;
    } else if (key == "l2_bandwidth") {
      g->l2_bandwidth = v;
    } else if (key == "hbm_bandwidth") {
      g->hbm_bandwidth = v;
    } else if (key == "memory_bytes") {
      g->memory_bytes = v;
    } else if (key == "latency_per_matmul") {
      g->latency_per_matmul_s = v;
    } else if (key == "shared_bytes_per_clock") {
      g->shared_bytes_per_clock = v;
    } else {
      return Bad(origin,
                 fmt::format("unknown key '{}' (known: name, bits, peak_flops, "
                             "effective_utilization, num_sms, max_clock_hz, "
                             "register_bytes_per_block, l2_bytes, l2_bandwidth, hbm_bandwidth, "
                             "memory_bytes, distributed_shared_memory, latency_per_matmul, "
                             "shared_bytes_per_clock)",
                             full));
    }
  }
  return Status::Ok();
}

Status ParseLevel(const toml::table& t, std::string_view origin, size_t index, NetworkLevel* l) {
  for (const auto& [k, node] : t) {
    std::string key(k.str());
    std::string full = fmt::format("network[{}].{}", index, key);
    if (key == "name") {
      auto s = node.value<std::string>();
      if (!s) return Bad(origin, fmt::format("'{}' must be a string", full));
      l->name = *s;
      continue;
    }
    double v = 0;
    ATOLL_RETURN_IF_ERROR(GetNumber(node, origin, full, &v));
    if (key == "size") {
      if (v < 0 || v != std::floor(v)) {
        return Bad(origin, fmt::format("'{}' must be a whole number of GPUs", full));
      }
      l->size = static_cast<int64_t>(v);
    } else if (key == "bandwidth") {
      l->bandwidth = v;
    } else if (key == "latency") {
      l->latency_s = v;
    } else {
      return Bad(origin,
                 fmt::format("unknown key '{}' (known: name, size, bandwidth, latency)", full));
    }
  }
  if (l->name.empty()) l->name = fmt::format("level{}", index);
  return Status::Ok();
}

}  // namespace

Status ApplyHardwareOverridesFromString(std::string_view text, std::string_view origin,
                                        Hardware* hw) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    return Bad(origin,
               fmt::format("line {}, column {}: {}", where.line, where.column, e.description()));
  }
  // Base first, so the tables below apply on top of it.
  std::string base_gpu = hw->gpu.name;
  std::string base_network = hw->network_name;
  bool rebuild = false;
  if (auto* n = root.get("base_gpu")) {
    auto s = n->value<std::string>();
    if (!s) return Bad(origin, "'base_gpu' must be a string");
    base_gpu = *s;
    rebuild = true;
  }
  if (auto* n = root.get("base_network")) {
    auto s = n->value<std::string>();
    if (!s) return Bad(origin, "'base_network' must be a string");
    base_network = *s;
    rebuild = true;
  }
  if (rebuild) {
    auto rebuilt = MakeHardware(base_gpu, base_network);
    if (!rebuilt.ok()) return rebuilt.status().WithContext(fmt::format("hardware file {}", origin));
    *hw = *rebuilt;
  }
  for (const auto& [k, node] : root) {
    std::string key(k.str());
    if (key == "base_gpu" || key == "base_network") continue;
    if (key == "name") {
      auto s = node.value<std::string>();
      if (!s) return Bad(origin, "'name' must be a string");
      hw->gpu.name = *s;
    } else if (key == "gpu") {
      const toml::table* t = node.as_table();
      if (!t) return Bad(origin, "'gpu' must be a table ([gpu])");
      ATOLL_RETURN_IF_ERROR(ApplyGpuTable(*t, origin, &hw->gpu));
    } else if (key == "network") {
      const toml::array* a = node.as_array();
      if (!a || a->empty()) {
        return Bad(origin, "'network' must be a non-empty array of tables ([[network]])");
      }
      std::vector<NetworkLevel> levels;
      for (size_t i = 0; i < a->size(); ++i) {
        const toml::table* t = (*a)[i].as_table();
        if (!t) return Bad(origin, fmt::format("network[{}] must be a table", i));
        NetworkLevel l;
        ATOLL_RETURN_IF_ERROR(ParseLevel(*t, origin, i, &l));
        levels.push_back(l);
      }
      hw->network = levels;
      hw->network_name = "custom";
    } else {
      return Bad(origin,
                 fmt::format("unknown key '{}' (known: name, base_gpu, base_network, [gpu], "
                             "[[network]])",
                             key));
    }
  }
  return ValidateHardware(*hw).WithContext(fmt::format("hardware file {}", origin));
}

Status ApplyHardwareOverrides(const std::string& path, Hardware* hw) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status().WithContext("reading hardware overrides");
  return ApplyHardwareOverridesFromString(*text, path, hw);
}

}  // namespace atl::plan
