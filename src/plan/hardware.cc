#include "plan/hardware.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

namespace atl::plan {
namespace {

constexpr double kMi = 1024 * 1024;

// Latency of one message or collective step at each network level, and of one matmul.
// 4.5 us per matmul is gpu_model.py's value for every GPU. Per network level, 1.125 us: the
// paper's, and gpu_model.py's at b1f771c (an earlier version had 5 us, which
// configs/hardware/h100-reference-code.toml reproduces; docs/PLANNER.md 1.6 has its effect).
constexpr double kNetworkLatency = 1.125e-6;
constexpr double kMatmulLatency = 4.5e-6;

// Peak = FLOP per clock per thread x 128 threads per SM x SMs x clock, as gpu_model.py derives it.
double Peak(double flop_per_clock_per_thread, int sms, double clock_hz) {
  return flop_per_clock_per_thread * 128.0 * sms * clock_hz;
}

struct CatalogueEntry {
  Gpu gpu;
  double nvlink_bandwidth;    // bytes/s per GPU, bidirectional
  double scaleout_bandwidth;  // bytes/s per GPU, bidirectional (InfiniBand)
  int64_t node_size;          // GPUs per NVLink domain
};

std::vector<CatalogueEntry> Catalogue() {
  std::vector<CatalogueEntry> c;
  {
    // NVIDIA V100 SXM2 32 GB. Datasheet: 125 TFLOP/s tensor (16-bit), 900 GB/s HBM2, 32 GB,
    // NVLink 300 GB/s (https://images.nvidia.com/content/technologies/volta/pdf/
    // volta-v100-datasheet-update-us-1165301-r5.pdf). 80 SMs at 1533 MHz, 6 MiB L2 (Volta
    // whitepaper). L2 bandwidth 2155 GB/s and 0.9 effective utilization: gpu_model.py.
    // Scale-out: DGX-1 has 4x 100 Gb/s EDR InfiniBand for 8 GPUs = 6.25 GB/s per GPU each way
    // (https://images.nvidia.com/content/pdf/dgx1-v100-system-architecture-whitepaper.pdf).
    Gpu g;
    g.name = "V100";
    g.num_sms = 80;
    g.max_clock_hz = 1533e6;
    g.peak_flops = Peak(8, g.num_sms, g.max_clock_hz);  // 125.6 TFLOP/s
    g.effective_utilization = 0.9;
    g.l2_bytes = 6 * kMi;
    g.l2_bandwidth = 2155e9;
    g.hbm_bandwidth = 900e9;
    g.memory_bytes = 3.2e10;
    g.distributed_shared_memory = false;
    g.latency_per_matmul_s = kMatmulLatency;
    c.push_back({g, 3e11, 1.25e10, 8});
  }
  {
    // NVIDIA A100 SXM4 40 GB. Datasheet: 312 TFLOP/s BF16 dense, 1555 GB/s HBM2, 40 GB, NVLink
    // 600 GB/s (https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
    // nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf). 108 SMs at 1410 MHz, 40 MiB L2
    // (Ampere whitepaper). L2 5603 GB/s as profiled by chipsandcheese.com (2023-07-02);
    // 0.85 effective utilization: gpu_model.py. Scale-out: DGX A100 has 8x 200 Gb/s HDR
    // (ConnectX-6), 25 GB/s per GPU each way.
    Gpu g;
    g.name = "A100";
    g.num_sms = 108;
    g.max_clock_hz = 1410e6;
    g.peak_flops = Peak(16, g.num_sms, g.max_clock_hz);  // 311.9 TFLOP/s
    g.effective_utilization = 0.85;
    g.l2_bytes = 40 * kMi;
    g.l2_bandwidth = 5603e9;
    g.hbm_bandwidth = 1555e9;
    g.memory_bytes = 4e10;
    g.distributed_shared_memory = false;
    g.latency_per_matmul_s = kMatmulLatency;
    c.push_back({g, 6e11, 5e10, 8});
  }
  {
    // NVIDIA H100 SXM5 80 GB. Datasheet: 989 TFLOP/s BF16 dense (1979 with sparsity), 3.35 TB/s
    // HBM3, 80 GB, NVLink 900 GB/s (https://resources.nvidia.com/en-us-tensor-core). 132 SMs at
    // 1830 MHz, 50 MiB L2, distributed shared memory (Hopper whitepaper v1.03). L2 6441 GB/s and
    // 0.7 effective utilization: gpu_model.py. Scale-out: DGX H100 has 8x 400 Gb/s NDR
    // (ConnectX-7), 50 GB/s per GPU each way.
    Gpu g;
    g.name = "H100";
    g.num_sms = 132;
    g.max_clock_hz = 1830e6;
    g.peak_flops = Peak(32, g.num_sms, g.max_clock_hz);  // 989.4 TFLOP/s
    g.effective_utilization = 0.7;
    g.l2_bytes = 50 * kMi;
    g.l2_bandwidth = 6441e9;
    g.hbm_bandwidth = 3352e9;
    g.memory_bytes = 8e10;
    g.distributed_shared_memory = true;
    g.latency_per_matmul_s = kMatmulLatency;
    c.push_back({g, 9e11, 1e11, 8});
  }
  {
    // NVIDIA H200 SXM 141 GB. Datasheet: 989 TFLOP/s BF16 dense, 4.8 TB/s HBM3e, 141 GB, NVLink
    // 900 GB/s (https://www.nvidia.com/en-us/data-center/h200/). Same GH100 die as the H100 SXM,
    // so SMs, clock, L2 and effective utilization are the H100's (an assumption: NVIDIA does
    // not publish them separately). Scale-out: DGX H200 has 8x 400 Gb/s ConnectX-7.
    Gpu g;
    g.name = "H200";
    g.num_sms = 132;
    g.max_clock_hz = 1830e6;
    g.peak_flops = Peak(32, g.num_sms, g.max_clock_hz);
    g.effective_utilization = 0.7;
    g.l2_bytes = 50 * kMi;
    g.l2_bandwidth = 6441e9;
    g.hbm_bandwidth = 4.8e12;
    g.memory_bytes = 141e9;
    g.distributed_shared_memory = true;
    g.latency_per_matmul_s = kMatmulLatency;
    c.push_back({g, 9e11, 1e11, 8});
  }
  {
    // NVIDIA B200 (HGX/DGX B200). Datasheet: 72 PFLOP/s FP8 training per 8 GPUs with sparsity,
    // i.e. 2.25 PFLOP/s BF16 dense per GPU; 1,440 GB HBM3e at 64 TB/s per 8 GPUs, i.e. 180 GB
    // and 8 TB/s per GPU; NVLink 5 at 1.8 TB/s per GPU; 8x 400 Gb/s ConnectX-7
    // (https://www.nvidia.com/en-us/data-center/dgx-b200/). Not on the datasheet, so estimates:
    // 148 SMs and 126 MB L2 (public die analyses), 8192 dense BF16 FLOP per SM per clock (twice
    // Hopper) which puts the clock at 1.856 GHz, L2 bandwidth scaled from the H100 per SM and
    // clock, and the H100's 0.7 effective utilization. Blackwell doubles tensor throughput per
    // SM and feeds it from shared and tensor memory; with Hopper's 128 shared-memory bytes per
    // clock the model would starve it, so we keep Hopper's bytes per FLOP (256 per clock).
    Gpu g;
    g.name = "B200";
    g.num_sms = 148;
    g.peak_flops = 2.25e15;
    g.max_clock_hz = g.peak_flops / (8192.0 * g.num_sms);
    g.effective_utilization = 0.7;
    g.l2_bytes = 126e6;
    g.l2_bandwidth = 6441e9 / (132 * 1830e6) * g.num_sms * g.max_clock_hz;
    g.hbm_bandwidth = 8e12;
    g.memory_bytes = 180e9;
    g.distributed_shared_memory = true;
    g.latency_per_matmul_s = kMatmulLatency;
    g.shared_bytes_per_clock = 256;
    c.push_back({g, 1.8e12, 1e11, 8});
  }
  return c;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

struct Variant {
  const char* name;
  const char* description;
};

constexpr Variant kVariants[] = {
    {"default",
     "8-GPU NVLink nodes joined by InfiniBand, 1.125 us per level (the paper's baseline)"},
    {"low-latency",
     "default links with a tenth of the network and matmul latency (the reference code's 'H100 "
     "SXM Low Latency')"},
    {"zero-latency",
     "default links with zero network and matmul latency (the paper's 'zero latency' case)"},
    {"global-nvlink", "one flat NVLink-bandwidth network spanning every GPU, 1.125 us latency"},
    {"infinite", "one flat network of infinite bandwidth, zero network and matmul latency"},
    {"superpod", "256-GPU NVLink domains (DGX SuperPOD) joined by InfiniBand"},
};

}  // namespace

std::vector<std::string> GpuNames() {
  std::vector<std::string> names;
  for (const auto& e : Catalogue()) names.push_back(e.gpu.name);
  return names;
}

std::vector<std::string> NetworkVariantNames() {
  std::vector<std::string> names;
  for (const auto& v : kVariants) names.push_back(v.name);
  return names;
}

std::string DescribeNetworkVariant(std::string_view name) {
  for (const auto& v : kVariants) {
    if (name == v.name) return v.description;
  }
  return "";
}

StatusOr<Gpu> FindGpu(std::string_view name) {
  std::string want = Lower(name);
  for (const char* suffix : {" sxm", " sxm5", " sxm4", " sxm2"}) {
    std::string s(suffix);
    if (want.size() > s.size() && want.compare(want.size() - s.size(), s.size(), s) == 0) {
      want.resize(want.size() - s.size());
    }
  }
  for (const auto& e : Catalogue()) {
    if (Lower(e.gpu.name) == want) return e.gpu;
  }
  std::string known;
  for (const auto& n : GpuNames()) known += (known.empty() ? "" : ", ") + n;
  return Status::InvalidArgument(fmt::format("unknown GPU '{}' (known: {})", name, known));
}

StatusOr<Hardware> MakeHardware(std::string_view gpu_name, std::string_view network) {
  const CatalogueEntry* entry = nullptr;
  ATOLL_ASSIGN_OR_RETURN(Gpu gpu, FindGpu(gpu_name));
  auto catalogue = Catalogue();
  for (const auto& e : catalogue) {
    if (e.gpu.name == gpu.name) entry = &e;
  }
  Hardware hw;
  hw.gpu = gpu;
  std::string net = Lower(network);
  hw.network_name = net;
  NetworkLevel nvlink{"NVLink", entry->node_size, entry->nvlink_bandwidth, kNetworkLatency};
  NetworkLevel ib{"InfiniBand", 0, entry->scaleout_bandwidth, kNetworkLatency};
  if (net == "default") {
    hw.network = {nvlink, ib};
  } else if (net == "low-latency") {
    nvlink.latency_s /= 10;
    ib.latency_s /= 10;
    hw.gpu.latency_per_matmul_s /= 10;
    hw.network = {nvlink, ib};
  } else if (net == "zero-latency") {
    nvlink.latency_s = 0;
    ib.latency_s = 0;
    hw.gpu.latency_per_matmul_s = 0;
    hw.network = {nvlink, ib};
  } else if (net == "global-nvlink") {
    nvlink.size = 0;
    hw.network = {nvlink};
  } else if (net == "infinite") {
    hw.network = {NetworkLevel{"ideal", 0, std::numeric_limits<double>::infinity(), 0}};
    hw.gpu.latency_per_matmul_s = 0;
  } else if (net == "superpod") {
    nvlink.size = 256;
    hw.network = {nvlink, ib};
  } else {
    std::string known;
    for (const auto& n : NetworkVariantNames()) known += (known.empty() ? "" : ", ") + n;
    return Status::InvalidArgument(
        fmt::format("unknown network variant '{}' (known: {})", network, known));
  }
  return hw;
}

Status ValidateHardware(const Hardware& hw) {
  const Gpu& g = hw.gpu;
  auto positive = [&](double v, const char* what) -> Status {
    if (!(v > 0) || !std::isfinite(v)) {
      return Status::InvalidArgument(fmt::format(
          "hardware '{}': gpu.{} must be positive and finite, got {}", g.name, what, v));
    }
    return Status::Ok();
  };
  if (g.bits != 4 && g.bits != 8 && g.bits != 16 && g.bits != 32) {
    return Status::InvalidArgument(
        fmt::format("hardware '{}': gpu.bits must be 4, 8, 16 or 32, got {}", g.name, g.bits));
  }
  ATOLL_RETURN_IF_ERROR(positive(g.peak_flops, "peak_flops"));
  ATOLL_RETURN_IF_ERROR(positive(g.max_clock_hz, "max_clock_hz"));
  ATOLL_RETURN_IF_ERROR(positive(g.register_bytes_per_block, "register_bytes_per_block"));
  ATOLL_RETURN_IF_ERROR(positive(g.l2_bytes, "l2_bytes"));
  ATOLL_RETURN_IF_ERROR(positive(g.l2_bandwidth, "l2_bandwidth"));
  ATOLL_RETURN_IF_ERROR(positive(g.shared_bytes_per_clock, "shared_bytes_per_clock"));
  ATOLL_RETURN_IF_ERROR(positive(g.hbm_bandwidth, "hbm_bandwidth"));
  ATOLL_RETURN_IF_ERROR(positive(g.memory_bytes, "memory_bytes"));
  if (g.num_sms < 1) {
    return Status::InvalidArgument(fmt::format("hardware '{}': gpu.num_sms must be >= 1", g.name));
  }
  if (!(g.effective_utilization > 0 && g.effective_utilization <= 1)) {
    return Status::InvalidArgument(
        fmt::format("hardware '{}': gpu.effective_utilization must be in (0, 1], got {}", g.name,
                    g.effective_utilization));
  }
  if (!(g.latency_per_matmul_s >= 0) || !std::isfinite(g.latency_per_matmul_s)) {
    return Status::InvalidArgument(
        fmt::format("hardware '{}': gpu.latency_per_matmul must be >= 0", g.name));
  }
  if (hw.network.empty()) {
    return Status::InvalidArgument(
        fmt::format("hardware '{}': the network needs at least one level", g.name));
  }
  for (size_t i = 0; i < hw.network.size(); ++i) {
    const NetworkLevel& l = hw.network[i];
    bool last = i + 1 == hw.network.size();
    if (!last && l.size < 2) {
      return Status::InvalidArgument(fmt::format(
          "hardware '{}': network level {} ('{}') needs size >= 2 (only the outermost level is "
          "unbounded)",
          g.name, i, l.name));
    }
    if (!(l.bandwidth > 0)) {
      return Status::InvalidArgument(fmt::format(
          "hardware '{}': network level {} ('{}') bandwidth must be positive", g.name, i, l.name));
    }
    if (!(l.latency_s >= 0) || !std::isfinite(l.latency_s)) {
      return Status::InvalidArgument(fmt::format(
          "hardware '{}': network level {} ('{}') latency must be >= 0", g.name, i, l.name));
    }
  }
  return Status::Ok();
}

std::string DescribeHardware(const Hardware& hw) {
  const Gpu& g = hw.gpu;
  std::string out = fmt::format(
      "{}: {:.1f} TFLOP/s peak ({}-bit dense), {:.0f}% reachable, {:.0f} GB HBM at {:.2f} TB/s, "
      "{:.1f} us per matmul\n",
      g.name, g.peak_flops / 1e12, g.bits, g.effective_utilization * 100, g.memory_bytes / 1e9,
      g.hbm_bandwidth / 1e12, g.latency_per_matmul_s * 1e6);
  out += fmt::format("network '{}':", hw.network_name);
  for (const auto& l : hw.network) {
    out += fmt::format(" [{}: {}{:.4g} GB/s per GPU, {:.3g} us]", l.name,
                       l.size > 0 ? fmt::format("{} GPUs, ", l.size) : std::string(),
                       l.bandwidth / 1e9, l.latency_s * 1e6);
  }
  return out + "\n";
}

}  // namespace atl::plan
