// Authentication between the processes of a world: mutual TLS (a CA, and a certificate per party,
// which names it: CN and subjectAltName DNS "coordinator" or "site-N") plus a shared token sent
// with every call. A client verifies that the server's certificate names the party it dials (the
// coordinator, or site N); a server checks that the caller's certificate names the site the call
// claims to come from (CheckParty). So one site's key cannot act as another site or as the
// coordinator.
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
#include <string_view>

#include "core/status.h"

namespace atl {

// The parties' names, in their certificates (CN and subjectAltName DNS).
inline constexpr const char* kCoordinatorParty = "coordinator";
std::string SiteParty(int site);  // site-N
// The metadata key carrying the shared token.
inline constexpr const char* kTokenHeader = "x-atoll-token";

struct WorldSecurity {
  bool insecure = false;  // plaintext, no token: tests only
  std::string ca_pem, cert_pem, key_pem;
  std::string token;
};

// Reads DIR/ca.pem, DIR/NAME.pem, DIR/NAME.key and DIR/token. NotFound / InvalidArgument (exit 2)
// naming the file when one is missing, empty or not PEM, and InvalidArgument for a site whose
// DIR holds ca.key (the CA's key).
StatusOr<WorldSecurity> LoadSecurity(const std::string& dir, const std::string& name);
// The shared token in a token file's text (`path` names it in messages): without trailing
// newlines and spaces, 16 to kMaxTokenBytes visible ASCII characters (it is sent as gRPC
// metadata); InvalidArgument otherwise.
inline constexpr size_t kMaxTokenBytes = 4096;
StatusOr<std::string> ParseToken(std::string_view text, const std::string& path);

// Server credentials: TLS requiring a client certificate signed by the CA, and the token checked
// on each call's metadata before its body is read (an auth metadata processor); or insecure.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const WorldSecurity& s);
// A channel to host:port with TLS (client certificate; the server's certificate must name
// `server_party`: kCoordinatorParty or SiteParty(n)) or insecure. `max_message_bytes` raises
// gRPC's receive limit for large chunks.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const WorldSecurity& s,
                                           const std::string& server_party,
                                           int max_message_bytes = 64 << 20);
// The same with extra channel arguments (e.g. GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, so a client
// reconnects quickly to a restarted server); the message limits and TLS name are set on top.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const WorldSecurity& s,
                                           const std::string& server_party,
                                           grpc::ChannelArguments args,
                                           int max_message_bytes = 64 << 20);
// Adds the token to an outgoing call.
void AddToken(grpc::ClientContext* context, const WorldSecurity& s);
// On the server: OK if the call carries the token (compared in constant time; always OK in
// insecure mode), else UNAUTHENTICATED naming the peer (the caller logs it).
grpc::Status CheckToken(const grpc::ServerContext& context, const WorldSecurity& s);
// The party the caller's verified certificate names: its one subjectAltName DNS name (or, with
// none, its CN), which its CN must equal; "" in insecure mode or when it names none or several.
std::string CallerParty(const grpc::ServerContext& context);
// (TLS) That the caller's certificate names `party` (the site the call claims to come from):
// PERMISSION_DENIED naming both otherwise (the caller logs it). After CheckToken.
grpc::Status CheckParty(const grpc::ServerContext& context, const WorldSecurity& s,
                        const std::string& party);

}  // namespace atl
