// WanEndpoint: the public face of an endpoint's WanCore.
#include <fmt/format.h>

#include <cmath>

#include "world/transport/core.h"

namespace atl::transport {

class WanEndpointImpl final : public WanEndpoint {
 public:
  explicit WanEndpointImpl(std::shared_ptr<WanCore> core) : core_(std::move(core)) {}
  std::string address() const override { return core_->address(); }
  StatusOr<std::unique_ptr<Communicator>> Connect(const WanOptions& options) override {
    return core_->Connect(options);
  }
  Status Reconnect(int site, const std::string& address) override {
    return core_->Reconnect(site, address);
  }
  void Publish(uint64_t index, std::shared_ptr<const std::string> blob) override {
    core_->Publish(index, std::move(blob));
  }
  std::vector<int> ring() const override { return core_->ring(); }
  WanStats stats() const override { return core_->stats(); }
  void PeerAlive(int site, const std::string& address, int64_t epoch) override {
    core_->PeerAlive(site, address, epoch);
  }
  void SetEpoch(int64_t epoch) override { core_->SetEpoch(epoch); }
  void PeerLost(int site, const std::string& address, const std::string& why) override {
    core_->PeerLost(site, address, why);
  }
  void SetPayloadFault(WanPayloadFault fault) override { core_->SetPayloadFault(std::move(fault)); }

 private:
  std::shared_ptr<WanCore> core_;
};

}  // namespace atl::transport

namespace atl {

StatusOr<std::unique_ptr<WanEndpoint>> WanEndpoint::Listen(const std::string& address,
                                                           const WorldSecurity& security,
                                                           double keepalive_s) {
  if (!(keepalive_s > 0) || !std::isfinite(keepalive_s))
    return Status::InvalidArgument(
        fmt::format("wan: keepalive_s {} must be a finite number > 0", keepalive_s));
  auto core = std::make_shared<transport::WanCore>(security);
  ATOLL_RETURN_IF_ERROR(core->Listen(address, keepalive_s));
  return std::unique_ptr<WanEndpoint>(new transport::WanEndpointImpl(std::move(core)));
}

}  // namespace atl
