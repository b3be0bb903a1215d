#include "world/certs.h"

#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/file.h"
#include "world/security.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "atoll_certs_test_XXXXXX").string();
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

int Mode(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return int(st.st_mode & 0777);
}

X509* ReadCert(const std::string& path) {
  auto text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << path;
  BIO* bio = BIO_new_mem_buf(text->data(), int(text->size()));
  X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  EXPECT_NE(x, nullptr) << path;
  return x;
}

class CertsTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = TempDir(); }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_F(CertsTest, WritesCaPartiesAndToken) {
  const std::string dir = root_ + "/certs";
  ASSERT_TRUE(MakeCerts(dir, 2).ok());
  for (const char* f : {"ca.pem", "coordinator.pem", "coordinator.key", "site-0.pem", "site-0.key",
                        "site-1.pem", "site-1.key", "token"})
    EXPECT_TRUE(FileExists(dir + "/" + f)) << f;
  // The CA's key only in the authority's directory, beside DIR (what is copied to the parties).
  const std::string ca = root_ + "/certs-ca";
  EXPECT_EQ(DefaultCaDir(dir + "/"), ca);
  for (const char* f : {"ca.pem", "ca.key", "token"}) EXPECT_TRUE(FileExists(ca + "/" + f)) << f;
  EXPECT_FALSE(FileExists(dir + "/site-2.pem"));
  EXPECT_FALSE(FileExists(dir + "/ca.key"));
  EXPECT_FALSE(FileExists(dir + "/ca"));
  EXPECT_EQ(Mode(dir), 0700);
  EXPECT_EQ(Mode(ca), 0700);
  for (const char* f : {"ca.key", "token"}) EXPECT_EQ(Mode(ca + "/" + f), 0600) << f;
  for (const char* f : {"coordinator.key", "site-0.key", "site-1.key", "token"})
    EXPECT_EQ(Mode(dir + "/" + f), 0600) << f;
  auto token = ReadFile(dir + "/token");
  ASSERT_TRUE(token.ok());
  ASSERT_EQ(token->size(), 65u);
  EXPECT_EQ(token->back(), '\n');
  EXPECT_EQ(token->find_first_not_of("0123456789abcdef"), 64u);
  // No temporary files left behind.
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();

  for (const char* party : {"site-0", "site-1", "coordinator"}) {
    auto s = LoadSecurity(dir, party);
    ASSERT_TRUE(s.ok()) << party << ": " << s.status().ToString();
    EXPECT_FALSE(s->insecure);
    EXPECT_EQ(s->token.size(), 64u);
  }
}

TEST_F(CertsTest, CertificatesChainToTheCaAndNameTheirParty) {
  const std::string dir = root_ + "/certs";
  ASSERT_TRUE(MakeCerts(dir, 1).ok());
  X509* ca = ReadCert(dir + "/ca.pem");
  X509_STORE* store = X509_STORE_new();
  ASSERT_EQ(X509_STORE_add_cert(store, ca), 1);
  for (const char* party : {"site-0", "coordinator"}) {
    X509* x = ReadCert(dir + "/" + party + ".pem");
    ASSERT_NE(x, nullptr);
    // The party's name, as subjectAltName DNS (what a client verifies) and CN (what a server
    // reads); no other party's, nor the shared name older certificates had.
    EXPECT_EQ(X509_check_host(x, party, 0, 0, nullptr), 1) << party;
    for (const char* other : {"atoll", "site-1", "site-0", "coordinator"})
      if (std::string(other) != party)
        EXPECT_NE(X509_check_host(x, other, 0, 0, nullptr), 1) << party << " as " << other;
    char cn[64] = {};
    X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof cn);
    EXPECT_STREQ(cn, party);
    int days = 0, secs = 0;
    ASSERT_EQ(ASN1_TIME_diff(&days, &secs, X509_get0_notBefore(x), X509_get0_notAfter(x)), 1);
    EXPECT_GE(days, 3650);
    EXPECT_LE(days, 3660);
    for (int purpose : {X509_PURPOSE_SSL_CLIENT, X509_PURPOSE_SSL_SERVER}) {
      X509_STORE_CTX* ctx = X509_STORE_CTX_new();
      ASSERT_EQ(X509_STORE_CTX_init(ctx, store, x, nullptr), 1);
      X509_STORE_CTX_set_purpose(ctx, purpose);
      EXPECT_EQ(X509_verify_cert(ctx), 1)
          << party << ": " << X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx));
      X509_STORE_CTX_free(ctx);
    }
    X509_free(x);
  }
  X509_STORE_free(store);
  X509_free(ca);
}

TEST_F(CertsTest, RefusesANonEmptyDirectoryUnlessForced) {
  const std::string dir = root_ + "/certs";
  ASSERT_TRUE(MakeCerts(dir, 1).ok());
  auto token = ReadFile(dir + "/token");
  Status again = MakeCerts(dir, 1);
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(again.message().find("--force"), std::string::npos) << again.message();
  EXPECT_EQ(*ReadFile(dir + "/token"), *token);  // untouched
  ASSERT_TRUE(MakeCerts(dir, 3, /*force=*/true).ok());
  EXPECT_NE(*ReadFile(dir + "/token"), *token);
  EXPECT_TRUE(LoadSecurity(dir, "site-2").ok());
  // An existing empty directory is fine.
  fs::create_directory(root_ + "/empty");
  EXPECT_TRUE(MakeCerts(root_ + "/empty", 1).ok());
}

TEST_F(CertsTest, RefusesBadArguments) {
  EXPECT_EQ(MakeCerts(root_ + "/a", 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCerts("", 1).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteFileAtomic(root_ + "/file", "x").ok());
  EXPECT_EQ(MakeCerts(root_ + "/file", 1).code(), StatusCode::kInvalidArgument);
}

// One more party's certificate from the CA directory, for another host: it chains to the same CA,
// names its party, comes with the world's token, and its directory never gets the CA's key.
TEST_F(CertsTest, IssuesOnePartysCertificateWithoutTheCaKey) {
  const std::string dir = root_ + "/certs", other = root_ + "/site3";
  ASSERT_TRUE(MakeCerts(dir, 2).ok());
  const std::string ca = root_ + "/certs-ca";
  ASSERT_TRUE(IssueCert(ca, "site-3", other).ok());
  for (const char* f : {"ca.pem", "token", "site-3.pem", "site-3.key"})
    EXPECT_TRUE(FileExists(other + "/" + f)) << f;
  EXPECT_FALSE(FileExists(other + "/ca.key"));
  EXPECT_EQ(*ReadFile(other + "/token"), *ReadFile(dir + "/token"));
  EXPECT_EQ(*ReadFile(other + "/ca.pem"), *ReadFile(dir + "/ca.pem"));
  X509* x = ReadCert(other + "/site-3.pem");
  EXPECT_EQ(X509_check_host(x, "site-3", 0, 0, nullptr), 1);
  X509_STORE* store = X509_STORE_new();
  X509* ca_cert = ReadCert(dir + "/ca.pem");
  ASSERT_EQ(X509_STORE_add_cert(store, ca_cert), 1);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  ASSERT_EQ(X509_STORE_CTX_init(ctx, store, x, nullptr), 1);
  EXPECT_EQ(X509_verify_cert(ctx), 1);
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  X509_free(ca_cert);
  X509_free(x);
  EXPECT_TRUE(LoadSecurity(other, "site-3").ok());
  // Refused: an existing key (without --force), a name that is not a party, a directory holding
  // the CA's key, a directory holding another world's token, a CA directory without its key.
  EXPECT_EQ(IssueCert(ca, "site-3", other).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(IssueCert(ca, "site-3", other, /*force=*/true).ok());
  for (const char* bad : {"atoll", "site-", "site-01", "site-x", "Coordinator", "site-1/../x"})
    EXPECT_EQ(IssueCert(ca, bad, root_ + "/bad").code(), StatusCode::kInvalidArgument) << bad;
  EXPECT_EQ(IssueCert(ca, "site-4", ca).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(IssueCert(dir, "site-4", root_ + "/x").code(), StatusCode::kNotFound);
  ASSERT_TRUE(MakeCerts(root_ + "/world2", 1).ok());
  EXPECT_EQ(IssueCert(root_ + "/world2-ca", "site-4", other).code(),
            StatusCode::kInvalidArgument);  // other holds the first world's token
  // A site whose directory holds the CA's key does not start.
  ASSERT_TRUE(WriteFileAtomic(other + "/ca.key", *ReadFile(ca + "/ca.key")).ok());
  const auto loaded = LoadSecurity(other, "site-3");
  EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("CA's private key"), std::string::npos);
}

}  // namespace

}  // namespace atl

namespace atl {
namespace {

// The token travels as gRPC metadata: only visible ASCII, 16 to kMaxTokenBytes characters.
TEST(ParseTokenTest, AcceptsVisibleAsciiAndRefusesTheRest) {
  auto ok = ParseToken("0123456789abcdef0123\r\n \n", "dir/token");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, "0123456789abcdef0123");
  for (std::string bad :
       {std::string("short\n"), std::string("0123456789 abcdef"),
        std::string("0123456789abcdef\x01", 17), std::string("0123456789abcdef\0tail", 21),
        std::string("0123456789abcdef\xc3\xa9"), std::string(atl::kMaxTokenBytes + 1, 'a')}) {
    auto s = ParseToken(bad, "dir/token");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("dir/token"), std::string::npos);
  }
}

}  // namespace
}  // namespace atl
