// Authentication between the processes of a world: mutual TLS (a CA, and a certificate per site and
// for the coordinator, all issued for the name "atoll") plus a shared token sent with every call.
//
// A certs directory (made by `atoll certs`, world/certs.h, or by hand with your own CA) holds
// ca.pem, and for each party NAME (coordinator, site-0, site-1, ...) NAME.pem and NAME.key, and
// token (the shared secret, one line). Insecure mode (no TLS, no token) exists for tests of the
// transport itself and must be asked for explicitly.
//
// Thread-safety: values and pure functions.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "core/status.h"

namespace atl {

// The name every certificate is issued for; clients verify the server against it.
inline constexpr const char* kTlsName = "atoll";
// The metadata key carrying the shared token.
inline constexpr const char* kTokenHeader = "x-atoll-token";

struct WorldSecurity {
  bool insecure = false;  // plaintext, no token: tests only
  std::string ca_pem, cert_pem, key_pem;
  std::string token;
};

// Reads DIR/ca.pem, DIR/NAME.pem, DIR/NAME.key and DIR/token. NotFound / InvalidArgument (exit 2)
// naming the file when one is missing, empty or not PEM.
StatusOr<WorldSecurity> LoadSecurity(const std::string& dir, const std::string& name);

// Server credentials: TLS requiring a client certificate signed by the CA (or insecure).
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const WorldSecurity& s);
// A channel to host:port with TLS (client certificate, server verified as kTlsName) or insecure.
// `max_message_bytes` raises gRPC's receive limit for large chunks.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const WorldSecurity& s,
                                           int max_message_bytes = 64 << 20);
// The same with extra channel arguments (e.g. GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, so a client
// reconnects quickly to a restarted server); the message limits and TLS name are set on top.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const WorldSecurity& s,
                                           grpc::ChannelArguments args,
                                           int max_message_bytes = 64 << 20);
// Adds the token to an outgoing call.
void AddToken(grpc::ClientContext* context, const WorldSecurity& s);
// On the server: OK if the call carries the token (always OK in insecure mode), else
// UNAUTHENTICATED naming the peer (the caller logs it).
grpc::Status CheckToken(const grpc::ServerContext& context, const WorldSecurity& s);

}  // namespace atl
