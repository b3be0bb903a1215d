// The WAN transport's connection: peers that never listen, never connect, vanish or stall (each
// named in the error, within the timeout), bad options, and authentication (token, mutual TLS,
// certificates naming another site, plaintext against TLS).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "core/log.h"
#include "world/proto/transport.pb.h"
#include "world/transport/test_world.h"
#include "world/wan.h"
#include "world/wan_internal.h"

namespace atl {
namespace {

using namespace testing_wan;  // NOLINT: the shared test world

// ---------------------------------------------------------------------------------------------
// Connecting, timeouts, authentication

TEST(Wan, PeerThatNeverListensTimesOutNamingIt) {
  auto ep = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(ep.ok());
  const DeadAddress nobody;
  const std::string& dead = nobody.str();
  WanOptions o;
  o.site = 0;
  o.peers = {{0, (*ep)->address()}, {1, dead}};
  o.timeout_s = 1.5;
  const double t0 = NowSeconds();
  auto c = (*ep)->Connect(o);
  const double took = NowSeconds() - t0;
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("site 1 (" + dead + ")"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("did not answer within 1.5 s"), std::string::npos)
      << c.status().message();
  EXPECT_GE(took, 1.4);
  EXPECT_LT(took, 10);
}

// Two endpoints on one address would split the peers' connections between them at random (gRPC
// listens with SO_REUSEPORT unless told not to): the second Listen must fail instead.
TEST(Wan, ListeningOnAnAddressInUseFails) {
  auto a = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = WanEndpoint::Listen((*a)->address(), Insecure());
  ASSERT_FALSE(b.ok()) << "a second endpoint listens on " << (*a)->address();
  EXPECT_NE(b.status().message().find("cannot listen on " + (*a)->address()), std::string::npos)
      << b.status().ToString();
}

TEST(Wan, PeerThatNeverCallsConnectTimesOutNamingIt) {
  auto a = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  auto b = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(a.ok() && b.ok());
  WanOptions o;
  o.site = 0;
  o.peers = {{0, (*a)->address()}, {1, (*b)->address()}};
  o.timeout_s = 1;
  auto c = (*a)->Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("site 1"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("has not called Connect"), std::string::npos)
      << c.status().message();
}

TEST(Wan, PeerThatVanishesFailsTheOperation) {
  // Far beyond the bound below: the failure must come from the closed streams, not the timeout.
  auto w = Start(2, [](WanOptions& o) { o.timeout_s = 30; });
  w->comms[1].reset();
  w->eps[1].reset();  // its streams close
  std::vector<float> v(10, 1.0f);
  const double t0 = NowSeconds();
  Status st = w->comms[0]->AllReduce(std::span<float>(v));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("site 1"), std::string::npos) << st.message();
  EXPECT_LT(NowSeconds() - t0, 10);
  EXPECT_EQ(v[0], 1.0f);
}

TEST(Wan, PeerThatStallsTimesOutNamingIt) {
  auto w = Start(2, [](WanOptions& o) { o.timeout_s = 1; });
  std::vector<float> v(100, 1.0f);
  const double t0 = NowSeconds();
  Status st = w->comms[0]->AllReduce(std::span<float>(v));  // site 1 never joins
  ASSERT_FALSE(st.ok());
  EXPECT_GE(NowSeconds() - t0, 0.99);
  EXPECT_NE(st.message().find("site 0: all_reduce of 100 float32: timed out after 1 s waiting for "
                              "site 1"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(v[0], 1.0f);
  // Site 0 told site 1, which fails the operation when it gets to it.
  st = w->comms[1]->AllReduce(std::span<float>(v));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("site 0 gave it up: timed out"), std::string::npos) << st.message();
  // Both dropped the failed operation's chunks: the next one works.
  CheckAllReduce<double>(*w, 1000);
}

TEST(Wan, InvalidOptions) {
  auto ep = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(ep.ok());
  WanOptions o;
  o.site = 2;
  o.peers = {{0, "127.0.0.1:1"}, {1, "127.0.0.1:2"}};
  auto c = (*ep)->Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("site 2 is not one of the 2 peers"), std::string::npos);
  o.site = 0;
  o.peers = {{1, "127.0.0.1:1"}, {0, "127.0.0.1:2"}};
  c = (*ep)->Connect(o);
  EXPECT_NE(c.status().message().find("ordered by site"), std::string::npos);
  o.peers = {{0, ""}, {1, "127.0.0.1:2"}};
  o.link = [](int, int) { return LinkProfile{-1, 0, 0}; };
  c = (*ep)->Connect(o);
  EXPECT_NE(c.status().message().find("latency_ms"), std::string::npos) << c.status().message();
  EXPECT_FALSE(WanEndpoint::Listen("256.1.1.1:0", Insecure()).ok());
}

// Certificates made with the openssl command line (not atoll's own `certs`): a CA, and for
// site-0 and site-1 a certificate naming the site (CN and subjectAltName DNS); "impostor" is a
// second valid site-1 certificate, which site 0 uses to claim to be itself.
class TlsFiles {
 public:
  TlsFiles() {
    dir_ = std::filesystem::temp_directory_path() /
           fmt::format("atoll_wan_tls_{}_{}", getpid(), std::rand());
    std::filesystem::create_directories(dir_);
    const std::string d = dir_.string();
    std::string cmd = fmt::format(
        "cd {0} && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout ca.key -out ca.pem -days 2 -subj /CN=atoll-test-ca "
        "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign",
        d);
    for (const auto& [file, party] : {std::pair{"site-0", "site-0"}, std::pair{"site-1", "site-1"},
                                      std::pair{"impostor", "site-1"}}) {
      std::ofstream(d + "/" + file + ".cnf")
          << "subjectAltName=DNS:" << party << "\nbasicConstraints=CA:FALSE\n"
          << "keyUsage=digitalSignature,keyEncipherment\n"
          << "extendedKeyUsage=serverAuth,clientAuth\n";
      cmd += fmt::format(
          " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "
          "{0}.key -out {0}.csr -subj /CN={1} && openssl x509 -req -in {0}.csr -CA ca.pem "
          "-CAkey ca.key -CAcreateserial -out {0}.pem -days 2 -extfile {0}.cnf",
          file, party);
    }
    // The CA's key is not left where the sites read their certificates (they refuse that).
    cmd += " && echo 0123456789abcdef-token > token && rm ca.key";
    ok_ = std::system(("(" + cmd + ") >/dev/null 2>&1").c_str()) == 0;
  }
  ~TlsFiles() { std::filesystem::remove_all(dir_); }
  bool ok() const { return ok_; }
  std::string dir() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
  bool ok_ = false;
};

TEST(WanTls, MutualTlsWithTokenWorksAndAWrongTokenIsRefused) {
  if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl";
  TlsFiles files;
  ASSERT_TRUE(files.ok()) << "openssl failed to make test certificates";
  std::vector<WorldSecurity> sec;
  for (int s = 0; s < 2; ++s) {
    auto x = LoadSecurity(files.dir(), fmt::format("site-{}", s));
    ASSERT_TRUE(x.ok()) << x.status().ToString();
    sec.push_back(*x);
  }
  {
    auto w = Start(2, SmallChunks(1000), sec);
    ASSERT_TRUE(w->comms[0] && w->comms[1]);
    CheckAllReduce<double>(*w, 3333);
  }
  // Site 1 holds another token: each refuses the other, naming it.
  sec[1].token = "another-token-of-16+chars";
  World w;
  auto st = TryStart(
      w, 2, [](WanOptions& o) { o.timeout_s = 5; }, sec);
  for (int s = 0; s < 2; ++s) {
    ASSERT_FALSE(st[s].ok()) << s;
    EXPECT_NE(st[s].message().find(fmt::format("site {} (", 1 - s)), std::string::npos)
        << st[s].message();
    EXPECT_NE(st[s].message().find("refused this site"), std::string::npos) << st[s].message();
    EXPECT_NE(st[s].message().find("token"), std::string::npos) << st[s].message();
  }
}

// Site 0 holds a valid certificate of site 1 (the "impostor"): site 1's server refuses its
// stream (the certificate names another site than the one claimed), and site 1, dialling site 0,
// refuses a server whose certificate does not name site 0.
TEST(WanTls, CertificateNamingAnotherSiteIsRefused) {
  if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl";
  TlsFiles files;
  ASSERT_TRUE(files.ok());
  auto good = LoadSecurity(files.dir(), "site-1");
  auto impostor = LoadSecurity(files.dir(), "impostor");  // CN site-1, used by site 0
  ASSERT_TRUE(good.ok() && impostor.ok());
  World w;
  ::testing::internal::CaptureStderr();  // the servers' refusals are logged there
  auto st = TryStart(w, 2, [](WanOptions& o) { o.timeout_s = 3; }, {*impostor, *good});
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_FALSE(st[1].ok());
  EXPECT_FALSE(st[0].ok());
  EXPECT_NE(st[1].message().find("site 0"), std::string::npos) << st[1].message();
  EXPECT_NE(st[1].message().find("Peer name site-0 is not in peer certificate"), std::string::npos)
      << st[1].message();
  EXPECT_NE(log.find("its certificate is for \"site-1\" but it claims site 0"), std::string::npos)
      << log;
}

TEST(WanTls, PlaintextPeerCannotReachATlsEndpoint) {
  if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl";
  TlsFiles files;
  ASSERT_TRUE(files.ok());
  auto sec = LoadSecurity(files.dir(), "site-0");
  ASSERT_TRUE(sec.ok());
  World w;
  auto st = TryStart(w, 2, [](WanOptions& o) { o.timeout_s = 1.5; }, {*sec, Insecure()});
  EXPECT_FALSE(st[0].ok());
  EXPECT_FALSE(st[1].ok());
  EXPECT_NE(st[1].message().find("site 0"), std::string::npos) << st[1].message();
}

TEST(WanTls, FetchSnapshotNeedsTheToken) {
  if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl";
  TlsFiles files;
  ASSERT_TRUE(files.ok());
  auto server = LoadSecurity(files.dir(), "site-0");
  auto client = LoadSecurity(files.dir(), "site-1");
  ASSERT_TRUE(server.ok() && client.ok());
  auto ep = WanEndpoint::Listen("127.0.0.1:0", *server);
  ASSERT_TRUE(ep.ok());
  auto blob = RandomBlob(100000, 5);
  (*ep)->Publish(1, blob);
  auto f = FetchSnapshot((*ep)->address(), *client, 1, 0, 5, /*server_site=*/0);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(f->second == *blob);
  client->token = "another-token-of-16+chars";
  f = FetchSnapshot((*ep)->address(), *client, 1, 0, 5, 0);
  EXPECT_EQ(f.status().code(), StatusCode::kUnavailable) << f.status().ToString();
  EXPECT_NE(f.status().message().find("refused this site"), std::string::npos)
      << f.status().message();
  EXPECT_NE(f.status().message().find("token"), std::string::npos) << f.status().message();
  auto impostor = LoadSecurity(files.dir(), "impostor");  // CN site-1
  ASSERT_TRUE(impostor.ok());
  f = FetchSnapshot((*ep)->address(), *impostor, 0, 0, 5, 0);
  EXPECT_NE(f.status().message().find("its certificate is for \"site-1\" but it claims site 0"),
            std::string::npos)
      << f.status().message();
  // A server whose certificate names another site than the one dialled: the client refuses it
  // (here site 1's endpoint, fetched from as if it were site 0's). With TLS the serving site must
  // be named.
  client->token = server->token;
  auto other = WanEndpoint::Listen("127.0.0.1:0", *client);
  ASSERT_TRUE(other.ok());
  (*other)->Publish(1, blob);
  f = FetchSnapshot((*other)->address(), *server, 0, 0, 5, /*server_site=*/0);
  EXPECT_EQ(f.status().code(), StatusCode::kUnavailable) << f.status().ToString();
  f = FetchSnapshot((*other)->address(), *server, 0, 0, 5, /*server_site=*/1);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  f = FetchSnapshot((*other)->address(), *server, 0, 0, 5);
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << f.status().ToString();
}

}  // namespace
}  // namespace atl
