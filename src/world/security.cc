#include "world/security.h"

#include <fmt/format.h>
#include <openssl/crypto.h>

#include <string_view>

#include "core/file.h"
#include "core/log.h"

namespace atl {

namespace {
StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  auto text = ReadFile(path);
  if (!text.ok())
    return Status::NotFound(
        fmt::format("{}: cannot read the {} ({}); make a certs directory "
                    "with `atoll certs --out DIR --sites N`",
                    path, what, text.status().message()));
  if (text->find("-----BEGIN ") == std::string::npos)
    return Status::InvalidArgument(fmt::format("{}: the {} is not PEM", path, what));
  return text;
}
}  // namespace

StatusOr<WorldSecurity> LoadSecurity(const std::string& dir, const std::string& name) {
  // A site never holds the CA's key: whoever holds it can make any party's certificate.
  if (name.rfind("site-", 0) == 0 && FileExists(dir + "/ca.key"))
    return Status::InvalidArgument(fmt::format(
        "{}/ca.key: the CA's private key is in {}'s certificates directory; keep it only where "
        "the certificates are made (`atoll certs` puts it in DIR-ca) and remove it here",
        dir, name));
  WorldSecurity s;
  ATOLL_ASSIGN_OR_RETURN(s.ca_pem, ReadPem(dir + "/ca.pem", "CA certificate"));
  ATOLL_ASSIGN_OR_RETURN(s.cert_pem, ReadPem(dir + "/" + name + ".pem", "certificate"));
  ATOLL_ASSIGN_OR_RETURN(s.key_pem, ReadPem(dir + "/" + name + ".key", "private key"));
  auto token = ReadFile(dir + "/token");
  if (!token.ok())
    return Status::NotFound(fmt::format("{}/token: cannot read the shared token", dir));
  ATOLL_ASSIGN_OR_RETURN(s.token, ParseToken(*token, dir + "/token"));
  return s;
}

StatusOr<std::string> ParseToken(std::string_view text, const std::string& path) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.remove_suffix(1);
  if (text.size() < 16)
    return Status::InvalidArgument(
        fmt::format("{}: the shared token must be at least 16 characters", path));
  if (text.size() > kMaxTokenBytes)
    return Status::InvalidArgument(
        fmt::format("{}: the shared token is {} bytes, more than the {} allowed", path, text.size(),
                    kMaxTokenBytes));
  // It travels as a gRPC metadata value: visible ASCII (HTTP/2 may trim spaces at its ends).
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] <= 0x20 || text[i] > 0x7e)
      return Status::InvalidArgument(
          fmt::format("{}: byte {} of the shared token (0x{:02x}) is not visible ASCII", path, i,
                      static_cast<unsigned>(static_cast<unsigned char>(text[i]))));
  return std::string(text);
}

namespace {

bool SameToken(std::string_view got, const std::string& token) {
  // Constant time in the token's contents: how much of a guess matches is not timed.
  return got.size() == token.size() && CRYPTO_memcmp(got.data(), token.data(), token.size()) == 0;
}

// The token, checked on the call's metadata before gRPC reads the request's body or calls the
// handler: a caller without it costs the server no message buffer (the handlers check again).
class TokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenProcessor(std::string token) : token_(std::move(token)) {}
  bool IsBlocking() const override { return false; }  // a comparison: run it in line
  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    auto it = metadata.find(kTokenHeader);
    if (it != metadata.end() &&
        SameToken(std::string_view(it->second.data(), it->second.size()), token_))
      return grpc::Status::OK;
    std::string who = "a caller";
    if (context != nullptr)
      for (const auto& id : context->GetPeerIdentity())
        who = fmt::format("a caller with the certificate of \"{}\"",
                          std::string(id.data(), id.size()));
    LogWarning("refused {} before reading its call: missing or wrong token", who);
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong token");
  }

 private:
  const std::string token_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const WorldSecurity& s) {
  if (s.insecure) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  opts.pem_root_certs = s.ca_pem;
  opts.pem_key_cert_pairs.push_back({s.key_pem, s.cert_pem});
  auto creds = grpc::SslServerCredentials(opts);
  creds->SetAuthMetadataProcessor(std::make_shared<TokenProcessor>(s.token));
  return creds;
}

std::string SiteParty(int site) { return fmt::format("site-{}", site); }

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const WorldSecurity& s,
                                           const std::string& server_party, int max_message_bytes) {
  return MakeChannel(address, s, server_party, grpc::ChannelArguments(), max_message_bytes);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const WorldSecurity& s,
                                           const std::string& server_party,
                                           grpc::ChannelArguments args, int max_message_bytes) {
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  if (s.insecure)
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  grpc::SslCredentialsOptions opts;
  opts.pem_root_certs = s.ca_pem;
  opts.pem_private_key = s.key_pem;
  opts.pem_cert_chain = s.cert_pem;
  args.SetSslTargetNameOverride(server_party);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(opts), args);
}

void AddToken(grpc::ClientContext* context, const WorldSecurity& s) {
  if (!s.insecure) context->AddMetadata(kTokenHeader, s.token);
}

grpc::Status CheckToken(const grpc::ServerContext& context, const WorldSecurity& s) {
  if (s.insecure) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find(kTokenHeader);
  if (it == md.end() || !SameToken(std::string_view(it->second.data(), it->second.size()), s.token))
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        fmt::format("peer {}: missing or wrong token", context.peer()));
  return grpc::Status::OK;
}

std::string CallerParty(const grpc::ServerContext& context) {
  auto auth = context.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return "";
  // gRPC's peer identity: the subjectAltName DNS names if there are any (what a client verifies a
  // server by), else the CN. A certificate names one party: several names, or a CN that differs
  // from its one SAN name, name none.
  const auto ids = auth->GetPeerIdentity();
  if (ids.size() != 1) return "";
  const std::string id(ids.front().data(), ids.front().size());
  for (const auto& cn : auth->FindPropertyValues("x509_common_name"))
    if (std::string(cn.data(), cn.size()) != id) return "";
  return id;
}

grpc::Status CheckParty(const grpc::ServerContext& context, const WorldSecurity& s,
                        const std::string& party) {
  if (s.insecure) return grpc::Status::OK;
  const std::string named = CallerParty(context);
  if (named != party)
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        fmt::format("peer {}: its certificate is for \"{}\" but it claims to be {}{}",
                    context.peer(), named, party,
                    named == "atoll" ? " (a certificate of an older `atoll certs`, which named "
                                       "no party: make the certificates again)"
                                     : ""));
  return grpc::Status::OK;
}

}  // namespace atl
