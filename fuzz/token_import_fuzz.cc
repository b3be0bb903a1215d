// The imported token formats (data/import.h: nanoGPT's raw .bin, llm.c's headered .bin) and the
// strict UTF-8 check of text imports (data/utf8.h FirstInvalidUtf8). The first input byte picks
// the reader; for llm.c, its second bit makes the header's magic, version and count right (random
// bytes rarely are), so the reading behind them is reached. Properties: accepted ids are exactly
// the bytes after the header; well-formed UTF-8 decodes and re-encodes to the same bytes.
#include <cstring>
#include <string>
#include <vector>

#include "data/import.h"
#include "data/utf8.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  const int which = in.Bit() ? 2 : (in.Bit() ? 1 : 0);
  const bool fix_header = in.Bit();
  std::vector<uint8_t> bytes(in.data(), in.data() + in.size());
  if (which == 0) {
    auto ids = atl::ParseNanoGptBin(bytes, "fuzz.bin");
    // Refused: an odd size, or the header of an atoll or an llm.c token file.
    const bool atoll = bytes.size() >= 8 && std::memcmp(bytes.data(), "ATOLTOK1", 8) == 0;
    int32_t magic = 0;
    if (bytes.size() >= 4) std::memcpy(&magic, bytes.data(), 4);
    FUZZ_CHECK(ids.ok() == (bytes.size() % 2 == 0 && !atoll && magic != atl::kLlmcMagic));
    if (ids.ok()) {
      FUZZ_CHECK(ids->size() * 2 == bytes.size());
      for (size_t i = 0; i < ids->size(); ++i)
        FUZZ_CHECK((*ids)[i] == uint16_t(bytes[2 * i] | (bytes[2 * i + 1] << 8)));
    }
  } else if (which == 1) {
    const size_t header = atl::kLlmcHeaderInts * 4;
    if (fix_header && bytes.size() >= header) {
      const int32_t fields[3] = {atl::kLlmcMagic, 1, int32_t((bytes.size() - header) / 2)};
      std::memcpy(bytes.data(), fields, sizeof fields);
    }
    auto ids = atl::ParseLlmcBin(bytes, "fuzz.bin");
    if (ids.ok()) {
      FUZZ_CHECK(bytes.size() == header + 2 * ids->size());
      for (size_t i = 0; i < ids->size(); ++i)
        FUZZ_CHECK((*ids)[i] == uint16_t(bytes[header + 2 * i] | (bytes[header + 2 * i + 1] << 8)));
    }
  } else {
    const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    const size_t bad = atl::FirstInvalidUtf8(text);
    FUZZ_CHECK(bad == std::string_view::npos || bad < text.size());
    // The well-formed prefix re-encodes to itself.
    const std::string_view good = text.substr(0, bad == std::string_view::npos ? text.size() : bad);
    FUZZ_CHECK(atl::FirstInvalidUtf8(good) == std::string_view::npos);
    std::vector<char32_t> cps;
    atl::DecodeUtf8(good, &cps);
    std::string again;
    for (char32_t cp : cps) atl::AppendUtf8(cp, &again);
    FUZZ_CHECK(again == good);
  }
  return 0;
}
