// The hardware catalogue: what one accelerator can do and how accelerators are wired together.
//
// Every value follows the data-movement model of Erdil & Schneider-Joseph ("Data movement limits
// to frontier model training", arXiv 2411.01137; their code: github
// ege-erdil/limits_to_distributed_training, gpu/gpu_model.py). Their conventions are kept so
// numbers can be compared one to one:
//   - peak FLOP/s is dense, at the model's bit width (16-bit here);
//   - `effective_utilization` is the fraction of peak that a long stream of big matmuls reaches;
//     the arithmetic clock is max_clock * effective_utilization, so no run can beat it;
//   - network bandwidths are per GPU and *bidirectional*; a collective moves data at half of it.
//
// Catalogue entries cite datasheets in hardware.cc. Any value can be overridden from a TOML file
// (ApplyHardwareOverrides, hardware_toml.cc).
//
// Thread-safety: values; pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace atl::plan {

// One accelerator.
struct Gpu {
  std::string name;
  int bits = 16;                     // word size of weights, activations and gradients
  double peak_flops = 0;             // dense FLOP/s at `bits`
  double effective_utilization = 1;  // reachable fraction of peak (clock derating)
  int num_sms = 1;                   // streaming multiprocessors (4 processing blocks each)
  double max_clock_hz = 1e9;
  double register_bytes_per_block = 64 * 1024;  // register file of one processing block
  double l2_bytes = 0;
  double l2_bandwidth = 0;                 // bytes/s
  double hbm_bandwidth = 0;                // bytes/s
  double memory_bytes = 0;                 // HBM capacity
  bool distributed_shared_memory = false;  // Hopper-style SM-to-SM network (thread block clusters)
  double latency_per_matmul_s = 0;         // fixed cost of every matmul (launch, tail, sync)
  double shared_bytes_per_clock = 128;     // per SM: 32 banks x 4 bytes (gpu_model.py)

  double bytes_per_word() const { return bits / 8.0; }
  // Arithmetic throughput a kernel can reach: peak * effective_utilization.
  double flop_per_s() const { return peak_flops * effective_utilization; }
  // Shared-memory bandwidth: bytes per cycle per SM at the derated clock.
  double shared_bandwidth() const {
    return shared_bytes_per_clock * num_sms * max_clock_hz * effective_utilization;
  }
};

// One level of the network hierarchy, innermost (fastest) first.
struct NetworkLevel {
  std::string name;      // "NVLink", "InfiniBand", "WAN"
  int64_t size = 0;      // GPUs in one domain of this level; 0 for the outermost (unbounded)
  double bandwidth = 0;  // bytes/s per GPU, bidirectional; +inf allowed
  double latency_s = 0;  // per message / per collective step
  // Collective latency model at this level: false = the reference's 2 latencies per all-reduce
  // (tree-like); true = a ring, 2 (p - 1) latencies for p participants (used for WAN links).
  bool ring_latency = false;
  // Bits per word on the wire for data-parallel traffic at this level; 0 = the model's bits.
  // WAN links may carry compressed (8- or 4-bit) gradients.
  int wire_bits = 0;
};

// A GPU and the network joining GPUs of its kind.
struct Hardware {
  Gpu gpu;
  std::string network_name;           // variant it was built from ("default", ...)
  std::vector<NetworkLevel> network;  // innermost first; every level but the last has size > 1
};

// Catalogue names, in catalogue order: V100, A100, H100, H200, B200.
std::vector<std::string> GpuNames();
// Network variants: default, low-latency, zero-latency, global-nvlink, infinite, superpod.
std::vector<std::string> NetworkVariantNames();
// One line describing a variant, for --help and docs.
std::string DescribeNetworkVariant(std::string_view name);

// Case-insensitive ("h100", "H100", "H100 SXM" all work).
StatusOr<Gpu> FindGpu(std::string_view name);
// The GPU with the named network variant built around it.
StatusOr<Hardware> MakeHardware(std::string_view gpu, std::string_view network = "default");

// Checks every value is usable (positive, finite where required, level sizes > 1).
Status ValidateHardware(const Hardware& hw);

// Reads a TOML override file and applies it to *hw (see docs/PLANNER.md and
// configs/hardware/*.toml for the keys). Unknown keys are errors. If the file names base_gpu or
// base_network, *hw is rebuilt from the catalogue first.
Status ApplyHardwareOverrides(const std::string& path, Hardware* hw);
// Same, from TOML text (tests; `origin` names it in errors).
Status ApplyHardwareOverridesFromString(std::string_view toml, std::string_view origin,
                                        Hardware* hw);

// A short multi-line description of the hardware (for reports).
std::string DescribeHardware(const Hardware& hw);

}  // namespace atl::plan
