// Writes the seed corpora of the fuzz targets (fuzz/corpus/TARGET/) with atoll's own writers, so
// every seed is a real encoding: `build/fuzz/fuzz/make_seeds fuzz/corpus` (scripts/fuzz.sh
// --seeds). Each seed starts with the parameter bytes its target takes off the front.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file.h"
#include "core/hash.h"
#include "data/dataset.h"
#include "data/import.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/safetensors.h"
#include "train/strategies/async_client.h"
#include "train/strategies/lowcomm.h"
#include "train/strategies/sync_state.h"
#include "world/codec.h"
#include "world/coordinator/membership.h"
#include "world/proto/transport.pb.h"
#include "world/transport/chunk.h"
#include "world/wan_internal.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string root;

void Seed(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(root + "/" + target);
  std::ofstream(root + "/" + target + "/" + name, std::ios::binary) << bytes;
}

template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::string Bytes(const std::string& path) {
  auto text = atl::ReadFile(path);
  if (!text.ok()) {
    std::fprintf(stderr, "make_seeds: %s\n", text.status().ToString().c_str());
    std::exit(1);
  }
  return *text;
}

std::vector<float> Floats(size_t n, float scale) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = scale * float(int(i % 7) - 3) / 3.0f;
  return x;
}

atl::RunConfig TinyConfig() {
  atl::RunConfig cfg;
  cfg.model = {.vocab_size = 16, .seq_len = 8, .n_layer = 1, .n_head = 2, .n_embd = 8};
  cfg.train.steps = 4;
  cfg.train.batch_size = 2;
  cfg.train.micro_batch_size = 1;
  cfg.train.warmup_steps = 1;
  return cfg;
}

void Configs() {
  atl::RunConfig cfg = TinyConfig();
  Seed("config_toml", "tiny.toml", atl::RunConfigToToml(cfg));
  Seed("config_json", "tiny.json", atl::RunConfigToJson(cfg).dump());
  Seed("config_json", "defaults.json", atl::RunConfigToJson(atl::RunConfig{}).dump());
}

void Checkpoint(const std::string& tmp) {
  atl::RunConfig cfg = TinyConfig();
  const size_t n = atl::NumParameters(cfg.model);
  const std::vector<float> p = Floats(n, 0.1f), m = Floats(n, 0.01f), v = Floats(n, 0.001f);
  atl::CheckpointSource src{&cfg, {2, 32, 1, 2, 100, 10}, 2, p.data(), m.data(), v.data()};
  const std::string dir = tmp + "/ckpt";
  if (!atl::WriteCheckpoint(dir, src).ok()) std::exit(1);
  Seed("manifest", "tiny", std::string(1, '\0') + Bytes(dir + "/manifest.json"));
  Seed("safetensors", "model", Bytes(dir + "/model.safetensors"));
  Seed("safetensors", "optimizer", Bytes(dir + "/optimizer.safetensors"));
  {
    // The dtypes of other tools' files (Hugging Face checkpoints: train/hf_import.h).
    atl::SafetensorsWriter w;
    const uint16_t halves[4] = {0x3c00, 0x8001, 0x7bff, 0x0400};
    const uint8_t mask[4] = {1, 0, 1, 1};
    const int64_t ids[2] = {-1, 50256};
    w.SetMetadata("format", "pt");
    w.Add("h.0.attn.c_attn.weight", atl::SafetensorsDType::kF16, {2, 2}, halves);
    w.Add("wte.weight", atl::SafetensorsDType::kBF16, {4}, halves);
    w.Add("h.0.attn.bias", atl::SafetensorsDType::kBool, {1, 1, 2, 2}, mask);
    w.Add("position_ids", atl::SafetensorsDType::kI64, {2}, ids);
    Seed("safetensors", "hf_dtypes", w.Serialize());
  }
}

void TokenFiles(const std::string& tmp) {
  const std::vector<uint16_t> tokens = {1, 2, 3, 50256, 7, 7, 9};
  if (!atl::WriteTokenFile(tmp + "/t.bin", tokens).ok()) std::exit(1);
  Seed("token_file", "seven", std::string(1, '\0') + Bytes(tmp + "/t.bin"));
  Seed("token", "hex", "0123456789abcdef0123456789abcdef\n");
  // token_import: [0][0][fix] nanoGPT ids; [0][1][1] an llm.c file; [1][fix] UTF-8 text.
  std::string ids;
  for (uint16_t t : tokens) ids += {char(t & 0xff), char(t >> 8)};
  Seed("token_import", "nanogpt", std::string("\0\0\0", 3) + ids);
  std::string llmc(atl::kLlmcHeaderInts * 4, '\0');
  const int32_t fields[3] = {atl::kLlmcMagic, 1, int32_t(tokens.size())};
  std::memcpy(llmc.data(), fields, sizeof fields);
  Seed("token_import", "llmc", std::string("\0\1\1", 3) + llmc + ids);
  Seed("token_import", "utf8",
       std::string("\1\0", 2) + "Caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n");
}

void Logs() {
  json init = {{"t", "init"},        {"count", 100}, {"checksum", atl::HashToHex(42)},
               {"max_staleness", 4}, {"build", "b"}, {"cpu", "c"}};
  std::string ops = init.dump() + "\n";
  for (int i = 0; i < 3; ++i)
    ops += json({{"t", "update"},
                 {"update_id", i},
                 {"site", i % 2},
                 {"base_version", i},
                 {"first_step", i},
                 {"last_step", i},
                 {"applied_version", i == 1 ? -1 : (i == 0 ? 1 : 2)},
                 {"checksum", atl::HashToHex(7 + i)},
                 {"bytes", 400},
                 {"weight", 0.5}})
               .dump() +
           "\n";
  ops +=
      json({{"t", "rejoin"}, {"site", 1}, {"step", 2}, {"version", 2}, {"next_update", 3}}).dump() +
      "\n";
  ops += json({{"t", "build"}, {"site", 1}, {"build", "x"}, {"cpu", "y"}}).dump() + "\n";
  Seed("op_log", "three_updates", ops);

  // A coordinator's log of three sites: registrations, the quorum, a round, a death, a rejoin.
  const int sites = 3;
  atl::MembershipState s(sites, 1.0, 3);
  std::string log;
  auto apply = [&](const json& r) {
    if (!s.Apply(r).ok()) std::exit(1);
    log += r.dump() + "\n";
  };
  apply(s.StartRecord());
  for (int site = 0; site < sites; ++site) {
    json r;
    atl::Registration reg{.site = site,
                          .incarnation = uint64_t(10 + site),
                          .wan_address = "127.0.0.1:" + std::to_string(7000 + site)};
    if (!s.PlanRegister(reg, &r).ok()) std::exit(1);
    apply(r);
    s.Beat(site, 10 + site, 0.5);
  }
  apply(*s.NextConsequence());  // the quorum
  for (int site = 0; site < sites; ++site) s.ReachRound(site, 0, atl::RoundVote{false, 9, 0.1});
  apply(*s.NextConsequence());  // round 0
  s.Beat(0, 10, 5);
  s.Beat(2, 12, 5);
  apply(*s.NextDeath(5));  // site 1
  json r;
  atl::Registration again{.site = 1,
                          .incarnation = 21,
                          .wan_address = "127.0.0.1:7001",
                          .rejoin = true,
                          .join_round = 2};
  if (!s.PlanRegister(again, &r).ok()) std::exit(1);
  apply(r);
  apply(s.RestartRecord());
  Seed("coordinator_log", "three_sites", std::string(1, char(sites - 1)) + log);

  // The membership target's requests: kind, site, incarnation, time step, then the kind's own.
  std::string ops_in(1, char(sites - 1));
  for (int site = 0; site < sites; ++site) {
    ops_in += {0, char(site), char(site), 1, char(site), 0, 0, 0, 0};  // register
  }
  ops_in += {5, 0, 0, 1};  // the quorum
  for (int site = 0; site < sites; ++site) ops_in += {4, char(site), char(site), 1, 1, 0, 9, 2, 0};
  ops_in += {5, 0, 0, 1};                                         // round 0
  ops_in += {3, 0, 0, 16, 3, 2, 2, 16, 6, 0, 0, 80};              // beats, then site 1 dies
  ops_in += {1, 1, 3, 1, 1, 0, 0, 2, 0, 2, 0, 0, 1, 7, 0, 0, 1};  // its rejoin, a leave, a restart
  Seed("membership", "three_sites", ops_in);
}

void Codecs() {
  const std::vector<float> x = Floats(300, 2.5f);
  for (atl::Codec c :
       {atl::Codec::kNone, atl::Codec::kBf16, atl::Codec::kInt8, atl::Codec::kInt4}) {
    std::vector<uint8_t> msg;
    atl::Encode(c, x, &msg);
    Seed("codec", std::string("decode_") + atl::CodecName(c),
         std::string(1, '\0') + std::string(msg.begin(), msg.end()));
    std::string raw(1, char(0x80 | uint8_t(c)));
    raw.append(reinterpret_cast<const char*>(x.data()), 64 * sizeof(float));
    Seed("codec", std::string("encode_") + atl::CodecName(c), raw);
  }
}

void Chunks() {
  // The receiver's side (wan_chunk_fuzz.cc's order), then the chunk.
  auto prefix = [](uint8_t from, uint8_t flags, uint8_t op, uint16_t total, uint16_t offset,
                   uint16_t count, uint64_t hash) {
    std::string s;
    Put<uint8_t>(&s, from);
    Put<uint32_t>(&s, 0);        // queued bytes
    Put<uint16_t>(&s, 0);        // pongs / 2
    Put<uint16_t>(&s, 0);        // aborts / 2
    Put<uint16_t>(&s, 0);        // rejoin readies / 2
    Put<uint16_t>(&s, 0);        // probe arrivals / 2
    Put<uint32_t>(&s, 1 << 20);  // max queued bytes
    Put<uint8_t>(&s, flags);
    Put<uint8_t>(&s, 5);  // op_seq
    Put<uint8_t>(&s, op);
    Put<uint8_t>(&s, 0);  // root
    Put<uint8_t>(&s, 1);  // ring step
    Put<uint8_t>(&s, 0);  // dtype float32
    Put<uint8_t>(&s, 3);  // element bytes 4
    Put<uint16_t>(&s, total);
    Put<uint16_t>(&s, offset);
    Put<uint16_t>(&s, count);
    Put<uint64_t>(&s, hash);
    return s;
  };
  const std::vector<float> x = Floats(16, 1.0f);
  const std::string payload(reinterpret_cast<const char*>(x.data()), 16 * sizeof(float));
  const uint64_t hash = atl::Hash64(payload);
  auto data = atl::transport::NewChunk({.from_site = 1,
                                        .op = uint32_t(atl::CommOp::kAllReduce),
                                        .op_seq = 5,
                                        .tag = 1,
                                        .offset = 16,
                                        .count = 16,
                                        .total = 64});
  data->set_payload(payload);
  data->set_checksum(hash);
  Seed("wan_chunk", "all_reduce",
       prefix(1, 1 | 4 | 8, uint8_t(atl::CommOp::kAllReduce), 64, 16, 16, hash) +
           data->SerializeAsString());
  auto info = atl::transport::NewChunk(
      {.from_site = 2, .op = atl::kWanOpInfo, .tag = atl::transport::kExchangeRejoinReady});
  info->set_payload("nonce-1234");
  Seed("wan_chunk", "info", prefix(2, 0, 0, 0, 0, 0, 0) + info->SerializeAsString());
  auto ping = atl::transport::NewChunk({.from_site = 0, .op = atl::kWanOpPing, .tag = 3});
  Seed("wan_chunk", "ping", prefix(0, 0, 0, 0, 0, 0, 0) + ping->SerializeAsString());
}

void SiteStates() {
  const size_t n = 5;
  atl::LowCommState lc;
  lc.completed = 6;
  lc.rounds = 2;
  lc.exchanges = 2;
  lc.global = lc.momentum = lc.params = Floats(n, 1.0f);
  Seed("site_state", "lowcomm_rejoin", std::string{0, char(n), 0, 2} + atl::EncodeLowCommState(lc));
  lc.residual = lc.adam_m = lc.adam_v = Floats(n, 0.1f);
  lc.adam_steps = 6;
  Seed("site_state", "lowcomm_resume", std::string{0, char(n), 0, 2} + atl::EncodeLowCommState(lc));
  const std::vector<float> p = Floats(n, 1.0f), m = Floats(n % 3, 0.1f);
  Seed("site_state", "sync",
       std::string{1, char(n), 0, 2} + atl::EncodeSyncState(4, 4, 2, {0, 2}, p, m, m));
  atl::AsyncSiteState as;
  as.completed = 8;
  as.pushes = 3;
  as.residual = as.adam_m = as.adam_v = Floats(n, 0.5f);
  as.adam_steps = 8;
  Seed("site_state", "async", std::string{2, char(n), 0, 2} + atl::EncodeAsyncSiteState(as));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR (writes CORPUS_DIR/TARGET/NAME)\n");
    return 2;
  }
  root = argv[1];
  const std::string tmp = fs::temp_directory_path() / ("atoll_seeds_" + std::to_string(getpid()));
  fs::create_directories(tmp);
  Configs();
  Checkpoint(tmp);
  TokenFiles(tmp);
  Logs();
  Codecs();
  Chunks();
  SiteStates();
  fs::remove_all(tmp);
  return 0;
}
