#include "world/certs.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>

#include "core/file.h"
#include "world/security.h"

namespace atl {

namespace {

template <auto F>
struct Deleter {
  template <class T>
  void operator()(T* p) const {
    F(p);
  }
};
using PKey = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509_free>>;
using Bio = std::unique_ptr<BIO, Deleter<BIO_free_all>>;
using Bn = std::unique_ptr<BIGNUM, Deleter<BN_free>>;

constexpr long kTenYearsS = 3653L * 24 * 3600;

Status SslError(const std::string& what) {
  unsigned long e = ERR_get_error();
  char buf[256] = "unknown OpenSSL error";
  if (e != 0) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return Status::Internal(fmt::format("certs: {}: {}", what, buf));
}

StatusOr<PKey> NewKey() {
  PKey k(EVP_EC_gen("P-256"));
  if (k == nullptr) return SslError("generating an EC P-256 key");
  return k;
}

Status AddExt(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr)
    return SslError(fmt::format("making extension {}={}", OBJ_nid2sn(nid), value));
  int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (ok != 1) return SslError(fmt::format("adding extension {}", OBJ_nid2sn(nid)));
  return Status::Ok();
}

Status AddName(X509_NAME* name, const char* field, const std::string& value) {
  if (X509_NAME_add_entry_by_txt(name, field, MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1,
                                 0) != 1)
    return SslError(fmt::format("setting {}={}", field, value));
  return Status::Ok();
}

// A certificate for `key`, signed by issuer_key; issuer == nullptr: self-signed CA.
StatusOr<Cert> MakeCert(EVP_PKEY* key, const std::string& cn, const std::string& ou, X509* issuer,
                        EVP_PKEY* issuer_key) {
  const bool ca = issuer == nullptr;
  Cert x(X509_new());
  if (x == nullptr) return SslError("X509_new");
  if (X509_set_version(x.get(), 2) != 1) return SslError("setting the version");
  Bn serial(BN_new());
  if (serial == nullptr || BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(x.get())) == nullptr)
    return SslError("drawing a serial number");
  if (X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(x.get()), kTenYearsS) == nullptr)
    return SslError("setting the validity");
  if (X509_set_pubkey(x.get(), key) != 1) return SslError("setting the public key");
  X509_NAME* name = X509_get_subject_name(x.get());
  ATOLL_RETURN_IF_ERROR(AddName(name, "O", "atoll"));
  if (!ou.empty()) ATOLL_RETURN_IF_ERROR(AddName(name, "OU", ou));
  ATOLL_RETURN_IF_ERROR(AddName(name, "CN", cn));
  if (X509_set_issuer_name(x.get(), ca ? name : X509_get_subject_name(issuer)) != 1)
    return SslError("setting the issuer");
  X509* iss = ca ? x.get() : issuer;
  ATOLL_RETURN_IF_ERROR(AddExt(x.get(), iss, NID_subject_key_identifier, "hash"));
  ATOLL_RETURN_IF_ERROR(AddExt(x.get(), iss, NID_authority_key_identifier, "keyid:always"));
  if (ca) {
    ATOLL_RETURN_IF_ERROR(AddExt(x.get(), iss, NID_basic_constraints, "critical,CA:TRUE"));
    ATOLL_RETURN_IF_ERROR(AddExt(x.get(), iss, NID_key_usage, "critical,keyCertSign,cRLSign"));
  } else {
    ATOLL_RETURN_IF_ERROR(AddExt(x.get(), iss, NID_basic_constraints, "critical,CA:FALSE"));
    ATOLL_RETURN_IF_ERROR(
        AddExt(x.get(), iss, NID_key_usage, "critical,digitalSignature,keyAgreement"));
    ATOLL_RETURN_IF_ERROR(AddExt(x.get(), iss, NID_ext_key_usage, "serverAuth,clientAuth"));
    const std::string san = "DNS:" + cn;  // the party's name: what a client verifies
    ATOLL_RETURN_IF_ERROR(AddExt(x.get(), iss, NID_subject_alt_name, san.c_str()));
  }
  if (X509_sign(x.get(), issuer_key, EVP_sha256()) <= 0)
    return SslError(fmt::format("signing the certificate of {}", ou.empty() ? cn : ou));
  return x;
}

StatusOr<std::string> BioString(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  if (n <= 0 || data == nullptr) return SslError("reading a memory BIO");
  return std::string(data, size_t(n));
}

StatusOr<std::string> CertPem(X509* x) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || PEM_write_bio_X509(bio.get(), x) != 1)
    return SslError("writing a certificate as PEM");
  return BioString(bio.get());
}

StatusOr<std::string> KeyPem(EVP_PKEY* k) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr ||
      PEM_write_bio_PrivateKey(bio.get(), k, nullptr, nullptr, 0, nullptr, nullptr) != 1)
    return SslError("writing a private key as PEM");
  return BioString(bio.get());
}

// WriteFileAtomic with mode 0600 from the start (the secret is never readable by others).
Status WritePrivateAtomic(const std::string& path, std::string_view contents) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IoError(fmt::format("creating {}: {}", tmp, std::strerror(errno)));
  auto fail = [&](const char* what) {
    Status s = Status::IoError(fmt::format("{} {}: {}", what, tmp, std::strerror(errno)));
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  if (::fchmod(fd, 0600) != 0) return fail("chmod of");
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("writing");
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0) return fail("fsync of");
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s =
        Status::IoError(fmt::format("renaming {} to {}: {}", tmp, path, std::strerror(errno)));
    ::unlink(tmp.c_str());
    return s;
  }
  return Status::Ok();
}

Status WriteParty(const std::string& dir, const std::string& name, X509* ca, EVP_PKEY* ca_key) {
  ATOLL_ASSIGN_OR_RETURN(PKey key, NewKey());
  ATOLL_ASSIGN_OR_RETURN(Cert cert, MakeCert(key.get(), name, "", ca, ca_key));
  ATOLL_ASSIGN_OR_RETURN(std::string key_pem, KeyPem(key.get()));
  ATOLL_ASSIGN_OR_RETURN(std::string cert_pem, CertPem(cert.get()));
  ATOLL_RETURN_IF_ERROR(WritePrivateAtomic(dir + "/" + name + ".key", key_pem));
  return WriteFileAtomic(dir + "/" + name + ".pem", cert_pem);
}

// A directory for keys: created 0700, or an existing one that is empty (or `force`).
Status PrepareDir(const std::string& dir, bool force) {
  namespace fs = std::filesystem;
  if (dir.empty()) return Status::InvalidArgument("certs: the output directory is empty");
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec))
      return Status::InvalidArgument(fmt::format("certs: {} exists and is not a directory", dir));
    if (!fs::is_empty(dir, ec) && !force)
      return Status::InvalidArgument(
          fmt::format("certs: {} is not empty (it may hold a world's keys); choose another "
                      "directory or pass --force to replace the certificates in it",
                      dir));
    return Status::Ok();
  }
  ATOLL_RETURN_IF_ERROR(MakeDirs(dir));
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (ec) return Status::IoError(fmt::format("certs: chmod 0700 of {}: {}", dir, ec.message()));
  return Status::Ok();
}

// ca.pem and token into a party's directory.
Status WriteShared(const std::string& dir, const std::string& ca_pem, const std::string& token) {
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(dir + "/ca.pem", ca_pem));
  return WritePrivateAtomic(dir + "/token", token);
}

struct Authority {
  Cert ca;
  PKey key;
  std::string ca_pem, token;
};

StatusOr<Authority> ReadAuthority(const std::string& ca_dir) {
  Authority a;
  auto read = [&](const char* name) -> StatusOr<std::string> {
    auto text = ReadFile(ca_dir + "/" + name);
    if (!text.ok())
      return Status::NotFound(fmt::format(
          "certs: cannot read {}/{} ({}): --ca names the CA directory `atoll certs --out DIR` "
          "made (DIR/ca)",
          ca_dir, name, text.status().message()));
    return text;
  };
  ATOLL_ASSIGN_OR_RETURN(a.ca_pem, read("ca.pem"));
  ATOLL_ASSIGN_OR_RETURN(const std::string key_pem, read("ca.key"));
  ATOLL_ASSIGN_OR_RETURN(a.token, read("token"));
  Bio cb(BIO_new_mem_buf(a.ca_pem.data(), int(a.ca_pem.size())));
  a.ca.reset(cb ? PEM_read_bio_X509(cb.get(), nullptr, nullptr, nullptr) : nullptr);
  if (a.ca == nullptr) return SslError(fmt::format("reading {}/ca.pem", ca_dir));
  Bio kb(BIO_new_mem_buf(key_pem.data(), int(key_pem.size())));
  a.key.reset(kb ? PEM_read_bio_PrivateKey(kb.get(), nullptr, nullptr, nullptr) : nullptr);
  if (a.key == nullptr) return SslError(fmt::format("reading {}/ca.key", ca_dir));
  if (X509_check_private_key(a.ca.get(), a.key.get()) != 1)
    return Status::InvalidArgument(
        fmt::format("certs: {}/ca.key is not the key of {}/ca.pem", ca_dir, ca_dir));
  return a;
}

}  // namespace

std::string DefaultCaDir(const std::string& dir) {
  std::string d = std::filesystem::absolute(dir).lexically_normal().string();
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d + "-ca";
}

Status MakeCerts(const std::string& dir, int sites, bool force, std::string ca_dir) {
  if (sites < 1 || sites > 100000)
    return Status::InvalidArgument(fmt::format("certs: --sites must be >= 1 (got {})", sites));
  ATOLL_RETURN_IF_ERROR(PrepareDir(dir, force));
  if (ca_dir.empty()) ca_dir = DefaultCaDir(dir);
  ATOLL_RETURN_IF_ERROR(PrepareDir(ca_dir, /*force=*/true));
  // A key left by an older layout, beside the parties' files, is not left behind.
  ::unlink((dir + "/ca.key").c_str());

  ATOLL_ASSIGN_OR_RETURN(PKey ca_key, NewKey());
  ATOLL_ASSIGN_OR_RETURN(Cert ca, MakeCert(ca_key.get(), "atoll CA", "", nullptr, ca_key.get()));
  ATOLL_ASSIGN_OR_RETURN(std::string ca_key_pem, KeyPem(ca_key.get()));
  ATOLL_ASSIGN_OR_RETURN(std::string ca_pem, CertPem(ca.get()));
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) return SslError("drawing the token");
  std::string token;
  for (unsigned char c : raw) token += fmt::format("{:02x}", c);
  token += '\n';
  ATOLL_RETURN_IF_ERROR(WritePrivateAtomic(ca_dir + "/ca.key", ca_key_pem));
  ATOLL_RETURN_IF_ERROR(WriteShared(ca_dir, ca_pem, token));
  ATOLL_RETURN_IF_ERROR(SyncDir(ca_dir));

  ATOLL_RETURN_IF_ERROR(WriteShared(dir, ca_pem, token));
  ATOLL_RETURN_IF_ERROR(WriteParty(dir, kCoordinatorParty, ca.get(), ca_key.get()));
  for (int s = 0; s < sites; ++s)
    ATOLL_RETURN_IF_ERROR(WriteParty(dir, SiteParty(s), ca.get(), ca_key.get()));
  return SyncDir(dir);
}

Status IssueCert(const std::string& ca_dir, const std::string& party, const std::string& dir,
                 bool force) {
  bool named = party == kCoordinatorParty;
  if (!named && party.rfind("site-", 0) == 0 && party.size() > 5 && party.size() < 12) {
    named = party.find_first_not_of("0123456789", 5) == std::string::npos &&
            (party[5] != '0' || party.size() == 6);
  }
  if (!named)
    return Status::InvalidArgument(fmt::format(
        "certs: --issue {}: a party is \"coordinator\" or \"site-N\" (N = 0, 1, ...)", party));
  ATOLL_ASSIGN_OR_RETURN(const Authority a, ReadAuthority(ca_dir));
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir + "/" + party + ".key", ec) && !force)
    return Status::InvalidArgument(
        fmt::format("certs: {}/{}.key exists; pass --force to replace it", dir, party));
  if (!fs::exists(dir, ec)) ATOLL_RETURN_IF_ERROR(PrepareDir(dir, false));
  if (fs::exists(dir + "/ca.key", ec))
    return Status::InvalidArgument(fmt::format(
        "certs: {} holds a CA key: a party's directory must not (issue into another one)", dir));
  // Another world's party in the same directory would lose its CA and token.
  for (const auto& [file, want] : {std::pair{"ca.pem", &a.ca_pem}, std::pair{"token", &a.token}}) {
    auto have = ReadFile(dir + "/" + file);
    if (have.ok() && *have != *want && !force)
      return Status::InvalidArgument(fmt::format(
          "certs: {}/{} is another world's; issue into another directory or pass --force", dir,
          file));
  }
  ATOLL_RETURN_IF_ERROR(WriteShared(dir, a.ca_pem, a.token));
  ATOLL_RETURN_IF_ERROR(WriteParty(dir, party, a.ca.get(), a.key.get()));
  return SyncDir(dir);
}

}  // namespace atl
