// The hardware catalogue, network variants and TOML overrides (including the ways a bad file
// must be refused).
#include "plan/hardware.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace atl::plan {
namespace {

TEST(Catalogue, DatasheetValues) {
  Gpu h100 = *FindGpu("H100");
  EXPECT_NEAR(h100.peak_flops, 989.4e12, 0.1e12);  // 989 TFLOP/s BF16 dense
  EXPECT_DOUBLE_EQ(h100.effective_utilization, 0.7);
  EXPECT_DOUBLE_EQ(h100.hbm_bandwidth, 3.352e12);
  EXPECT_DOUBLE_EQ(h100.memory_bytes, 80e9);
  EXPECT_DOUBLE_EQ(h100.l2_bytes, 50.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(h100.latency_per_matmul_s, 4.5e-6);
  EXPECT_NEAR(FindGpu("V100")->peak_flops, 125e12, 1e12);
  EXPECT_NEAR(FindGpu("A100")->peak_flops, 312e12, 1e12);
  EXPECT_NEAR(FindGpu("H200")->peak_flops, 989.4e12, 0.1e12);
  EXPECT_DOUBLE_EQ(FindGpu("H200")->memory_bytes, 141e9);
  EXPECT_DOUBLE_EQ(FindGpu("H200")->hbm_bandwidth, 4.8e12);
  EXPECT_DOUBLE_EQ(FindGpu("B200")->peak_flops, 2.25e15);
  EXPECT_DOUBLE_EQ(FindGpu("B200")->memory_bytes, 180e9);
  EXPECT_DOUBLE_EQ(FindGpu("B200")->hbm_bandwidth, 8e12);
  EXPECT_EQ(GpuNames(), (std::vector<std::string>{"V100", "A100", "H100", "H200", "B200"}));
  for (const auto& name : GpuNames()) {
    for (const auto& net : NetworkVariantNames()) {
      auto hw = MakeHardware(name, net);
      ASSERT_TRUE(hw.ok()) << name << " " << net;
      EXPECT_TRUE(ValidateHardware(*hw).ok()) << name << " " << net;
    }
  }
}

TEST(Catalogue, NamesAreCaseInsensitive) {
  EXPECT_EQ(FindGpu("h100")->name, "H100");
  EXPECT_EQ(FindGpu("H100 SXM")->name, "H100");
  auto bad = FindGpu("X100");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("H100"), std::string::npos);  // lists the known ones
  EXPECT_EQ(MakeHardware("H100", "token-ring").status().code(), StatusCode::kInvalidArgument);
}

TEST(Catalogue, NetworkVariants) {
  Hardware d = *MakeHardware("H100", "default");
  ASSERT_EQ(d.network.size(), 2u);
  EXPECT_EQ(d.network[0].size, 8);
  EXPECT_DOUBLE_EQ(d.network[0].bandwidth, 9e11);  // NVLink 900 GB/s
  EXPECT_DOUBLE_EQ(d.network[1].bandwidth, 1e11);  // 8 x 400 Gb/s per 8 GPUs, both ways
  EXPECT_DOUBLE_EQ(d.network[1].latency_s, 1.125e-6);
  Hardware z = *MakeHardware("H100", "zero-latency");
  EXPECT_DOUBLE_EQ(z.network[0].latency_s, 0);
  EXPECT_DOUBLE_EQ(z.network[1].latency_s, 0);
  EXPECT_DOUBLE_EQ(z.gpu.latency_per_matmul_s, 0);
  // The reference code's "Low Latency": every latency divided by 10, bandwidths as they are.
  Hardware low = *MakeHardware("H100", "low-latency");
  ASSERT_EQ(low.network.size(), 2u);
  EXPECT_DOUBLE_EQ(low.network[0].latency_s, 1.125e-7);
  EXPECT_DOUBLE_EQ(low.network[1].latency_s, 1.125e-7);
  EXPECT_DOUBLE_EQ(low.network[1].bandwidth, 1e11);
  EXPECT_DOUBLE_EQ(low.gpu.latency_per_matmul_s, 4.5e-7);
  Hardware g = *MakeHardware("H100", "global-nvlink");
  ASSERT_EQ(g.network.size(), 1u);
  EXPECT_DOUBLE_EQ(g.network[0].bandwidth, 9e11);
  Hardware inf = *MakeHardware("H100", "infinite");
  EXPECT_TRUE(std::isinf(inf.network[0].bandwidth));
  EXPECT_EQ(MakeHardware("H100", "superpod")->network[0].size, 256);
}

TEST(Overrides, ApplyOnTopOfTheCatalogue) {
  Hardware hw = *MakeHardware("H100", "default");
  Status s = ApplyHardwareOverridesFromString(R"(
name = "H100, slow links"
[gpu]
effective_utilization = 0.6
latency_per_matmul = 2e-6
distributed_shared_memory = false
[[network]]
name = "NVLink"
size = 8
bandwidth = 9e11
latency = 5e-6
[[network]]
name = "Ethernet"
bandwidth = 2.5e10
latency = 1e-5
)",
                                              "test.toml", &hw);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(hw.gpu.name, "H100, slow links");
  EXPECT_DOUBLE_EQ(hw.gpu.effective_utilization, 0.6);
  EXPECT_DOUBLE_EQ(hw.gpu.latency_per_matmul_s, 2e-6);
  EXPECT_FALSE(hw.gpu.distributed_shared_memory);
  EXPECT_DOUBLE_EQ(hw.gpu.peak_flops, FindGpu("H100")->peak_flops);  // untouched
  ASSERT_EQ(hw.network.size(), 2u);
  EXPECT_EQ(hw.network[1].name, "Ethernet");
  EXPECT_DOUBLE_EQ(hw.network[1].bandwidth, 2.5e10);
  EXPECT_EQ(hw.network_name, "custom");
}

TEST(Overrides, BaseRebuildsFromTheCatalogue) {
  Hardware hw = *MakeHardware("H100", "default");
  ASSERT_TRUE(ApplyHardwareOverridesFromString("base_gpu = \"A100\"\nbase_network = \"superpod\"\n",
                                               "t", &hw)
                  .ok());
  EXPECT_EQ(hw.gpu.name, "A100");
  EXPECT_EQ(hw.network[0].size, 256);
}

TEST(Overrides, BadFilesAreRefusedWithTheReason) {
  Hardware hw = *MakeHardware("H100", "default");
  auto expect_bad = [&](const char* text, const char* needle) {
    Hardware copy = hw;
    Status s = ApplyHardwareOverridesFromString(text, "bad.toml", &copy);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(s.ExitCode(), 2);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("bad.toml"), std::string::npos) << s.message();
  };
  expect_bad("[gpu]\npeak_flop = 1e15\n", "gpu.peak_flop");          // typo: unknown key
  expect_bad("turbo = true\n", "turbo");                             // unknown top key
  expect_bad("[gpu]\npeak_flops = \"fast\"\n", "must be a number");  // wrong type
  expect_bad("[gpu]\npeak_flops = -1\n", "peak_flops");              // out of range
  expect_bad("[gpu]\neffective_utilization = 1.5\n", "effective_utilization");
  expect_bad("[[network]]\nsize = 1\nbandwidth = 1e9\n[[network]]\nbandwidth = 1e9\n", "size");
  expect_bad("[[network]]\nbandwidth = 0\n", "bandwidth");
  expect_bad("[gpu\npeak_flops = 1\n", "line 1");  // syntax
  expect_bad("base_gpu = \"Z9\"\n", "Z9");
}

TEST(Overrides, ReadsFilesAndReportsMissingOnes) {
  Hardware hw = *MakeHardware("H100", "default");
  EXPECT_EQ(ApplyHardwareOverrides("/no/such/hardware.toml", &hw).code(), StatusCode::kNotFound);
  std::string path = testing::TempDir() + "/plan_hw_override.toml";
  {
    std::ofstream f(path);
    f << "[gpu]\nhbm_bandwidth = 4e12\n";
  }
  ASSERT_TRUE(ApplyHardwareOverrides(path, &hw).ok());
  EXPECT_DOUBLE_EQ(hw.gpu.hbm_bandwidth, 4e12);
  std::remove(path.c_str());
}

TEST(Overrides, ShippedExampleFilesApply) {
  const char* root = std::getenv("ATOLL_SOURCE_DIR");
  std::filesystem::path dir = std::filesystem::path(root ? root : ".") / "configs" / "hardware";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir;
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    Hardware hw = *MakeHardware("H100", "default");
    Status s = ApplyHardwareOverrides(entry.path().string(), &hw);
    EXPECT_TRUE(s.ok()) << s.ToString();
    ++files;
  }
  EXPECT_GE(files, 3);
  Hardware ref = *MakeHardware("H100", "default");
  ASSERT_TRUE(ApplyHardwareOverrides((dir / "h100-reference-code.toml").string(), &ref).ok());
  EXPECT_DOUBLE_EQ(ref.network[1].latency_s, 5e-6);
}

}  // namespace
}  // namespace atl::plan
