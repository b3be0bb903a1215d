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
  for (const char* f : {"ca.pem", "ca.key", "coordinator.pem", "coordinator.key", "site-0.pem",
                        "site-0.key", "site-1.pem", "site-1.key", "token"})
    EXPECT_TRUE(FileExists(dir + "/" + f)) << f;
  EXPECT_FALSE(FileExists(dir + "/site-2.pem"));
  EXPECT_EQ(Mode(dir), 0700);
  for (const char* f : {"ca.key", "coordinator.key", "site-0.key", "site-1.key", "token"})
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

TEST_F(CertsTest, CertificatesChainToTheCaWithTheTlsName) {
  const std::string dir = root_ + "/certs";
  ASSERT_TRUE(MakeCerts(dir, 1).ok());
  X509* ca = ReadCert(dir + "/ca.pem");
  X509_STORE* store = X509_STORE_new();
  ASSERT_EQ(X509_STORE_add_cert(store, ca), 1);
  for (const char* party : {"site-0", "coordinator"}) {
    X509* x = ReadCert(dir + "/" + party + ".pem");
    ASSERT_NE(x, nullptr);
    EXPECT_EQ(X509_check_host(x, kTlsName, 0, 0, nullptr), 1) << party;
    char cn[64] = {};
    X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof cn);
    EXPECT_STREQ(cn, "atoll");
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

}  // namespace
}  // namespace atl
