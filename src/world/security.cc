#include "world/security.h"

#include <fmt/format.h>

#include "core/file.h"

namespace atl {

namespace {
StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  auto text = ReadFile(path);
  if (!text.ok())
    return Status::NotFound(fmt::format("{}: cannot read the {} ({}); make a certs directory "
                                        "with `atoll certs --out DIR --sites N`",
                                        path, what, text.status().message()));
  if (text->find("-----BEGIN ") == std::string::npos)
    return Status::InvalidArgument(fmt::format("{}: the {} is not PEM", path, what));
  return text;
}
}  // namespace

StatusOr<WorldSecurity> LoadSecurity(const std::string& dir, const std::string& name) {
  WorldSecurity s;
  ATOLL_ASSIGN_OR_RETURN(s.ca_pem, ReadPem(dir + "/ca.pem", "CA certificate"));
  ATOLL_ASSIGN_OR_RETURN(s.cert_pem, ReadPem(dir + "/" + name + ".pem", "certificate"));
  ATOLL_ASSIGN_OR_RETURN(s.key_pem, ReadPem(dir + "/" + name + ".key", "private key"));
  auto token = ReadFile(dir + "/token");
  if (!token.ok())
    return Status::NotFound(fmt::format("{}/token: cannot read the shared token", dir));
  s.token = *token;
  while (!s.token.empty() && (s.token.back() == '\n' || s.token.back() == '\r' ||
                              s.token.back() == ' '))
    s.token.pop_back();
  if (s.token.size() < 16)
    return Status::InvalidArgument(
        fmt::format("{}/token: the shared token must be at least 16 characters", dir));
  return s;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const WorldSecurity& s) {
  if (s.insecure) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  opts.pem_root_certs = s.ca_pem;
  opts.pem_key_cert_pairs.push_back({s.key_pem, s.cert_pem});
  return grpc::SslServerCredentials(opts);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const WorldSecurity& s,
                                           int max_message_bytes) {
  return MakeChannel(address, s, grpc::ChannelArguments(), max_message_bytes);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const WorldSecurity& s,
                                           grpc::ChannelArguments args, int max_message_bytes) {
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  if (s.insecure)
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  grpc::SslCredentialsOptions opts;
  opts.pem_root_certs = s.ca_pem;
  opts.pem_private_key = s.key_pem;
  opts.pem_cert_chain = s.cert_pem;
  args.SetSslTargetNameOverride(kTlsName);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(opts), args);
}

void AddToken(grpc::ClientContext* context, const WorldSecurity& s) {
  if (!s.insecure) context->AddMetadata(kTokenHeader, s.token);
}

grpc::Status CheckToken(const grpc::ServerContext& context, const WorldSecurity& s) {
  if (s.insecure) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find(kTokenHeader);
  if (it == md.end() || std::string(it->second.data(), it->second.size()) != s.token)
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        fmt::format("peer {}: missing or wrong token", context.peer()));
  return grpc::Status::OK;
}

}  // namespace atl
