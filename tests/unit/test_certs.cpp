#include <openssl/err.h>
#include <openssl/ssl.h>

#include "diaspora/certs.hpp"
#include "test_helpers.hpp"

namespace fs = std::filesystem;

namespace {

// A TLS handshake between two in-memory endpoints: returns "" on success, else why.
std::string handshake(const diaspora::DevCertFiles& f, const std::string& host, bool client_cert) {
  SSL_CTX* sctx = SSL_CTX_new(TLS_server_method());
  SSL_CTX* cctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_min_proto_version(sctx, TLS1_2_VERSION);
  SSL_CTX_use_certificate_chain_file(sctx, f.server_cert.c_str());
  SSL_CTX_use_PrivateKey_file(sctx, f.server_key.c_str(), SSL_FILETYPE_PEM);
  SSL_CTX_load_verify_locations(sctx, f.ca_cert.c_str(), nullptr);
  SSL_CTX_set_verify(sctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);  // mutual TLS
  SSL_CTX_load_verify_locations(cctx, f.ca_cert.c_str(), nullptr);
  SSL_CTX_set_verify(cctx, SSL_VERIFY_PEER, nullptr);
  if (client_cert) {
    SSL_CTX_use_certificate_file(cctx, f.client_cert.c_str(), SSL_FILETYPE_PEM);
    SSL_CTX_use_PrivateKey_file(cctx, f.client_key.c_str(), SSL_FILETYPE_PEM);
  }
  SSL* s = SSL_new(sctx);
  SSL* c = SSL_new(cctx);
  SSL_set1_host(c, host.c_str());
  BIO *sb, *cb;
  BIO_new_bio_pair(&sb, 0, &cb, 0);
  SSL_set_bio(s, sb, sb);
  SSL_set_bio(c, cb, cb);
  SSL_set_accept_state(s);
  SSL_set_connect_state(c);
  std::string why;
  bool sdone = false, cdone = false;
  for (int i = 0; i < 100 && !(sdone && cdone) && why.empty(); ++i) {
    for (auto [ssl, done] : {std::pair{c, &cdone}, std::pair{s, &sdone}}) {
      if (*done) continue;
      int r = SSL_do_handshake(ssl);
      if (r == 1) *done = true;
      else {
        int err = SSL_get_error(ssl, r);
        if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
          long v = SSL_get_verify_result(c);
          const char* reason = ERR_reason_error_string(ERR_peek_error());
          why = std::string(ssl == c ? "client" : "server") + " failed: " +
                (v != X509_V_OK ? X509_verify_cert_error_string(v) : reason ? reason : "?");
        }
      }
    }
  }
  if (why.empty() && !(sdone && cdone)) why = "handshake did not finish";
  if (why.empty() && SSL_version(c) < TLS1_2_VERSION) why = "negotiated below TLS 1.2";
  ERR_clear_error();
  SSL_free(s);
  SSL_free(c);
  SSL_CTX_free(sctx);
  SSL_CTX_free(cctx);
  return why;
}

}  // namespace

TEST(Certs, WritesChainedCertificatesWithPrivateKeys) {
  diaspora::test::TempDir dir;
  auto f = diaspora::write_dev_certificates(dir.path() / "certs");
  for (const auto& p : {f.ca_key, f.server_key, f.client_key})
    EXPECT_EQ(fs::status(p).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write) << p;
  for (const auto& p : {f.ca_cert, f.server_cert, f.client_cert}) {
    EXPECT_EQ(fs::status(p).permissions() & (fs::perms::group_write | fs::perms::others_write), fs::perms::none);
    EXPECT_NE(diaspora::test::read_file(p).find("BEGIN CERTIFICATE"), std::string::npos);
  }
  EXPECT_EQ(diaspora::check_certificate(f.ca_cert, f.server_cert, "localhost"), "");
  EXPECT_EQ(diaspora::check_certificate(f.ca_cert, f.server_cert, "127.0.0.1"), "");
  EXPECT_EQ(diaspora::check_certificate(f.ca_cert, f.server_cert, "::1"), "");
  EXPECT_NE(diaspora::check_certificate(f.ca_cert, f.server_cert, "example.org"), "");
  EXPECT_NE(diaspora::check_certificate(f.ca_cert, f.server_cert, "10.1.2.3"), "");
  EXPECT_EQ(diaspora::check_certificate(f.ca_cert, f.client_cert), "");
}

TEST(Certs, RealTlsHandshakeWithMutualAuthentication) {
  diaspora::test::TempDir dir;
  auto f = diaspora::write_dev_certificates(dir.path());
  EXPECT_EQ(handshake(f, "localhost", true), "");
  EXPECT_EQ(handshake(f, "127.0.0.1", true), "");
  EXPECT_NE(handshake(f, "wrong.example.org", true), "");  // hostname verification is on
  EXPECT_NE(handshake(f, "localhost", false), "");         // server demands a client certificate
}

TEST(Certs, AnotherCaIsNotTrusted) {
  diaspora::test::TempDir a, b;
  auto fa = diaspora::write_dev_certificates(a.path());
  auto fb = diaspora::write_dev_certificates(b.path());
  EXPECT_NE(diaspora::check_certificate(fb.ca_cert, fa.server_cert, "localhost"), "");
}

TEST(Certs, RefusesToOverwriteUnlessAsked) {
  diaspora::test::TempDir dir;
  auto f = diaspora::write_dev_certificates(dir.path());
  std::string before = diaspora::test::read_file(f.ca_cert);
  EXPECT_THROW(diaspora::write_dev_certificates(dir.path()), diaspora::Error);
  EXPECT_EQ(diaspora::test::read_file(f.ca_cert), before);
  diaspora::DevCertOptions o;
  o.overwrite = true;
  diaspora::write_dev_certificates(dir.path(), o);
  EXPECT_NE(diaspora::test::read_file(f.ca_cert), before);
}
