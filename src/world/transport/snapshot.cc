// Snapshots: Publish, serving one to a fetching site (paced like the link), and FetchSnapshot.
#include <fmt/format.h>

#include <algorithm>

#include "core/hash.h"
#include "world/transport/core.h"

namespace atl::transport {

void WanCore::Publish(uint64_t index, std::shared_ptr<const std::string> blob) {
  auto snap = std::make_shared<Snapshot>();
  snap->index = index;
  snap->blob = blob ? std::move(blob) : std::make_shared<const std::string>();
  std::lock_guard<std::mutex> lk(snapshot_mu_);
  snapshot_ = std::move(snap);
}

grpc::Status WanCore::HandleFetch(grpc::ServerContext* context, const pb::FetchRequest* request,
                                  grpc::ServerWriter<pb::FetchChunk>* writer) {
  const int64_t from = request->from_site();
  auto refuse = [&](grpc::StatusCode code, const std::string& why) {
    LogWarning("wan {}: refused a snapshot fetch from {} (site {}): {}", address_, context->peer(),
               from, why);
    return grpc::Status(code, why);
  };
  grpc::Status auth = CheckToken(*context, security_);
  if (!auth.ok()) return refuse(auth.error_code(), auth.error_message());
  if (request->version() != kWanProtocolVersion)
    return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                  fmt::format("protocol version {}, this endpoint speaks {}", request->version(),
                              kWanProtocolVersion));
  if (ClaimedSite(*context) != from)
    return refuse(grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("the request is from site {} but its {} header says otherwise", from,
                              kSiteHeader));
  if (std::string bad = CertificateMismatch(*context, security_, static_cast<int>(from));
      !bad.empty())
    return refuse(grpc::StatusCode::PERMISSION_DENIED, bad);
  std::shared_ptr<Snapshot> snap;
  {
    std::lock_guard<std::mutex> lk(snapshot_mu_);
    snap = snapshot_;
  }
  std::string self = fmt::format("wan {}", address_);
  std::optional<LinkEmulator> emu;
  int me = -1;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (configured_) {
      me = site_;
      self = fmt::format("site {}", site_);
      if (from >= n_ || from == site_)
        return refuse(grpc::StatusCode::INVALID_ARGUMENT,
                      fmt::format("it claims site {}, which is {}", from,
                                  from == site_ ? "this site" : "not a site of this world"));
      // Its own stream of jitter draws, apart from the link's.
      if (profiles_[from])
        emu.emplace(*profiles_[from], options_.seed,
                    (uint64_t{1} << 63) | (uint64_t(site_) << 32) | uint64_t(from));
    }
  }
  if (!snap || snap->index < request->min_index()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        snap ? fmt::format("{} has no snapshot with index >= {} (its latest is {})",
                                           self, request->min_index(), snap->index)
                             : fmt::format("{} has published no snapshot", self));
  }
  const std::string& blob = *snap->blob;
  const uint64_t checksum = snap->Checksum();
  const auto hook = FetchHook();
  // The whole snapshot is handed to the emulated link at once; each piece is written at its
  // emulated arrival (pacing by bandwidth, plus latency once), as the link's delay queue would.
  const double t0 = NowSeconds();
  size_t off = 0;
  pb::FetchChunk piece;
  do {
    const size_t n = std::min(kWanSnapshotPieceBytes, blob.size() - off);
    piece.set_index(snap->index);
    piece.set_total(blob.size());
    piece.set_offset(off);
    piece.set_data(blob.data() + off, n);
    piece.set_checksum(checksum);
    if (hook) (*hook)(me, static_cast<int>(from), piece);
    if (emu) {
      const double arrive = emu->Send(t0, n + 64).arrive_s;
      std::unique_lock<std::mutex> lk(mu_);
      if (cv_.wait_until(lk, SteadyAt(arrive), [&] { return shutting_down_; }))
        return grpc::Status(grpc::StatusCode::CANCELLED, "shutting down");
    }
    if (context->IsCancelled() || !writer->Write(piece))
      return grpc::Status(grpc::StatusCode::CANCELLED, "the fetch was cancelled");
    bytes_sent_ += n;
    off += n;
  } while (off < blob.size());
  LogDebug("wan {}: served snapshot {} ({} bytes) to site {}", self, snap->index, blob.size(),
           from);
  return grpc::Status::OK;
}

}  // namespace atl::transport

namespace atl {

namespace pb = ::atl::wan;
using transport::kMaxMessageBytes;
using transport::kSiteHeader;

StatusOr<std::pair<uint64_t, std::string>> FetchSnapshot(const std::string& address,
                                                         const WorldSecurity& security, int site,
                                                         uint64_t min_index, double timeout_s,
                                                         int server_site) {
  const std::string prefix = fmt::format("site {}: fetch snapshot from {}", site, address);
  if (address.empty())
    return Status::InvalidArgument(fmt::format("site {}: fetch snapshot: no address", site));
  if (site < 0) return Status::InvalidArgument(fmt::format("{}: bad site {}", prefix, site));
  if (!(timeout_s > 0) || !std::isfinite(timeout_s))
    return Status::InvalidArgument(
        fmt::format("{}: timeout_s {} must be a finite number > 0", prefix, timeout_s));
  if (!security.insecure && server_site < 0)
    return Status::InvalidArgument(fmt::format(
        "{}: with TLS the serving site must be named (its certificate is checked)", prefix));
  auto channel = MakeChannel(address, security, SiteParty(std::max(server_site, 0)),
                             grpc::ChannelArguments(), kMaxMessageBytes);
  auto stub = pb::Transport::NewStub(channel);
  grpc::ClientContext ctx;
  AddToken(&ctx, security);
  ctx.AddMetadata(kSiteHeader, std::to_string(site));
  ctx.set_deadline(ToSystemClock(SteadyAt(NowSeconds() + timeout_s)));
  pb::FetchRequest req;
  req.set_version(kWanProtocolVersion);
  req.set_from_site(static_cast<uint32_t>(site));
  req.set_min_index(min_index);
  auto reader = stub->Fetch(&ctx, req);
  // Every piece must continue the previous one and agree on the snapshot (index, size, checksum).
  pb::FetchChunk piece;
  std::string out, bad;
  bool first = true;
  uint64_t index = 0, total = 0, checksum = 0;
  while (reader->Read(&piece)) {
    if (first) {
      first = false;
      index = piece.index();
      total = piece.total();
      checksum = piece.checksum();
      if (index < min_index)
        bad = fmt::format("it sent snapshot {}, older than the {} asked for", index, min_index);
      else if (total > kMaxSnapshotBytes)
        bad = fmt::format("it announces a snapshot of {} bytes, over the {} accepted", total,
                          kMaxSnapshotBytes);
      else
        // Grown as bytes arrive beyond this: a peer's `total` reserves no more than 64 MiB.
        out.reserve(std::min<uint64_t>(total, uint64_t{64} << 20));
    } else if (piece.index() != index || piece.total() != total || piece.checksum() != checksum) {
      bad = fmt::format(
          "a piece says snapshot {} of {} bytes (checksum {}), the first said {} of {} ({})",
          piece.index(), piece.total(), HashToHex(piece.checksum()), index, total,
          HashToHex(checksum));
    }
    if (bad.empty() && piece.offset() != out.size())
      bad = fmt::format("a piece at offset {}, expected {}", piece.offset(), out.size());
    if (bad.empty() && piece.data().size() > total - out.size())
      bad = fmt::format("a piece of {} bytes at offset {} runs past the snapshot's {} bytes",
                        piece.data().size(), piece.offset(), total);
    if (!bad.empty()) {
      ctx.TryCancel();
      break;
    }
    out.append(piece.data());
  }
  grpc::Status s = reader->Finish();
  if (!bad.empty()) return Status::Corruption(fmt::format("{}: {}", prefix, bad));
  if (!s.ok()) {
    switch (s.error_code()) {
      case grpc::StatusCode::NOT_FOUND:
        return Status::NotFound(fmt::format("{}: {}", prefix, s.error_message()));
      case grpc::StatusCode::UNAUTHENTICATED:
      case grpc::StatusCode::PERMISSION_DENIED:
      case grpc::StatusCode::FAILED_PRECONDITION:
      case grpc::StatusCode::INVALID_ARGUMENT:
        return Status::Unavailable(
            fmt::format("{}: it refused this site: {}", prefix, s.error_message()));
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return Status::Unavailable(fmt::format("{}: not done within {} s ({} of {} bytes)", prefix,
                                               timeout_s, out.size(), total));
      default:
        return Status::Unavailable(fmt::format("{}: {}", prefix, s.error_message()));
    }
  }
  if (first) return Status::Corruption(fmt::format("{}: the reply held no piece", prefix));
  if (out.size() != total)
    return Status::Corruption(
        fmt::format("{}: the reply ended after {} of {} bytes", prefix, out.size(), total));
  if (const uint64_t h = Hash64(out.data(), out.size()); h != checksum)
    return Status::Corruption(
        fmt::format("{}: checksum mismatch (XXH3 of the {} bytes received {}, it says {})", prefix,
                    out.size(), HashToHex(h), HashToHex(checksum)));
  return std::pair<uint64_t, std::string>(index, std::move(out));
}

}  // namespace atl
