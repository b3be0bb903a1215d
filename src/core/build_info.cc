#include "core/build_info.h"

#include <elf.h>
#include <link.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/file.h"
#include "core/hash.h"

namespace atl {

namespace {

// The main program's NT_GNU_BUILD_ID note, hex, or "".
std::string GnuBuildId() {
  std::string id;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) -> int {
        // The first object is the main program.
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_NOTE) continue;
          const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
          const char* end = p + ph.p_memsz;
          while (p + sizeof(ElfW(Nhdr)) <= end) {
            const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
            const char* name = p + sizeof(ElfW(Nhdr));
            const char* desc = name + ((note->n_namesz + 3) & ~3u);
            if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 &&
                std::memcmp(name, "GNU", 4) == 0 && desc + note->n_descsz <= end) {
              auto* s = static_cast<std::string*>(out);
              static const char* kHex = "0123456789abcdef";
              for (uint32_t k = 0; k < note->n_descsz; ++k) {
                const auto b = static_cast<unsigned char>(desc[k]);
                s->push_back(kHex[b >> 4]);
                s->push_back(kHex[b & 15]);
              }
              return 1;
            }
            p = desc + ((note->n_descsz + 3) & ~3u);
          }
        }
        return 1;  // only the main program
      },
      &id);
  return id;
}

}  // namespace

std::string BuildId() {
  static const std::string id = [] {
    std::string gnu = GnuBuildId();
    if (!gnu.empty()) return gnu;
    auto bytes = ReadFile("/proc/self/exe");
    return bytes.ok() ? "xxh3:" + HashToHex(Hash64(bytes->data(), bytes->size()))
                      : std::string("unknown");
  }();
  return id;
}

std::string CpuDescription() {
  static const std::string desc = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line, model, flags;
    while (std::getline(in, line) && (model.empty() || flags.empty())) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string key = line.substr(0, colon);
      while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
      const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
      if (key == "model name" && model.empty()) model = value;
      if (key == "flags" && flags.empty()) flags = value;
    }
    std::istringstream words(flags);
    std::vector<std::string> have;
    for (std::string w; words >> w;) have.push_back(w);
    std::string vec;
    for (const char* f : {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                          "avx512_bf16", "avx512_fp16", "amx_tile"}) {
      for (const auto& h : have)
        if (h == f) {
          vec += (vec.empty() ? "" : " ") + h;
          break;
        }
    }
    std::string out = (model.empty() ? std::string("unknown CPU") : model) + " | " + vec;
    if (const char* core = std::getenv("OPENBLAS_CORETYPE"); core != nullptr && *core)
      out += std::string(" | ") + core;
    return out;
  }();
  return desc;
}

}  // namespace atl
