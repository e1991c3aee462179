#include "diaspora/certs.hpp"
#include "diaspora/files.hpp"

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace diaspora {

namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
};
template <class T>
using Ptr = std::unique_ptr<T, Free>;

[[noreturn]] void ssl_fail(const std::string& what) {
  std::string msg = what;
  unsigned long e = ERR_get_error();
  if (e) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    msg += ": ";
    msg += buf;
  }
  ERR_clear_error();
  throw Error(msg);
}

Ptr<EVP_PKEY> make_key() {
  Ptr<EVP_PKEY> key(EVP_EC_gen("P-256"));
  if (!key) ssl_fail("generating an EC P-256 key");
  return key;
}

void add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  Ptr<X509_EXTENSION> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!ext || !X509_add_ext(cert, ext.get(), -1)) ssl_fail("adding certificate extension " + value);
}

Ptr<X509> make_cert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key, int days,
                    const std::vector<std::pair<int, std::string>>& exts) {
  Ptr<X509> cert(X509_new());
  if (!cert) ssl_fail("X509_new");
  X509_set_version(cert.get(), 2);  // v3
  Ptr<BIGNUM> serial(BN_new());
  if (!serial || !BN_rand(serial.get(), 64, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) ||
      !BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())))
    ssl_fail("making a serial number");
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);  // tolerate clock skew
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("Diaspora development"),
                             -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* iss = issuer ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(iss));
  for (const auto& [nid, value] : exts) add_ext(cert.get(), iss, nid, value);
  if (!X509_sign(cert.get(), issuer_key, EVP_sha256())) ssl_fail("signing the certificate for " + cn);
  return cert;
}

std::string pem_of(X509* cert) {
  Ptr<BIO> bio(BIO_new(BIO_s_mem()));
  if (!bio || !PEM_write_bio_X509(bio.get(), cert)) ssl_fail("encoding a certificate");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

std::string pem_of(EVP_PKEY* key) {
  Ptr<BIO> bio(BIO_new(BIO_s_mem()));
  if (!bio || !PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr))
    ssl_fail("encoding a private key");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

}  // namespace

DevCertFiles write_dev_certificates(const std::filesystem::path& dir, const DevCertOptions& o) {
  if (o.valid_days < 1 || o.valid_days > 3650) throw Error("certificate validity must be 1 to 3650 days");
  if (o.dns_names.empty() && o.ip_addresses.empty()) throw Error("the server certificate needs at least one name");
  DevCertFiles f{dir / "ca.pem", dir / "ca-key.pem", dir / "server.pem", dir / "server-key.pem",
                 dir / "client.pem", dir / "client-key.pem"};
  if (!o.overwrite) {
    for (const auto& p : {f.ca_cert, f.ca_key, f.server_cert, f.server_key, f.client_cert, f.client_key})
      if (std::filesystem::exists(p))
        throw Error(p.string() + ": exists; refusing to overwrite (pass --force to replace all certificates)");
  }
  std::filesystem::create_directories(dir);

  auto ca_key = make_key();
  auto ca = make_cert(ca_key.get(), "Diaspora development CA", nullptr, ca_key.get(), o.valid_days,
                      {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                       {NID_key_usage, "critical,keyCertSign,cRLSign"},
                       {NID_subject_key_identifier, "hash"}});
  std::string san;
  for (const auto& d : o.dns_names) san += (san.empty() ? "" : ",") + std::string("DNS:") + d;
  for (const auto& ip : o.ip_addresses) san += (san.empty() ? "" : ",") + std::string("IP:") + ip;
  auto server_key = make_key();
  auto server = make_cert(server_key.get(), o.dns_names.empty() ? o.ip_addresses.front() : o.dns_names.front(), ca.get(),
                          ca_key.get(), o.valid_days,
                          {{NID_basic_constraints, "critical,CA:FALSE"},
                           {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
                           {NID_ext_key_usage, "serverAuth"},
                           {NID_subject_key_identifier, "hash"},
                           {NID_authority_key_identifier, "keyid:always"},
                           {NID_subject_alt_name, san}});
  auto client_key = make_key();
  auto client = make_cert(client_key.get(), o.client_name, ca.get(), ca_key.get(), o.valid_days,
                          {{NID_basic_constraints, "critical,CA:FALSE"},
                           {NID_key_usage, "critical,digitalSignature"},
                           {NID_ext_key_usage, "clientAuth"},
                           {NID_subject_key_identifier, "hash"},
                           {NID_authority_key_identifier, "keyid:always"}});

  write_file_atomic(f.ca_key, pem_of(ca_key.get()), 0600);
  write_file_atomic(f.server_key, pem_of(server_key.get()), 0600);
  write_file_atomic(f.client_key, pem_of(client_key.get()), 0600);
  write_file_atomic(f.ca_cert, pem_of(ca.get()), 0644);
  write_file_atomic(f.server_cert, pem_of(server.get()), 0644);
  write_file_atomic(f.client_cert, pem_of(client.get()), 0644);
  return f;
}

std::string check_certificate(const std::filesystem::path& ca_file, const std::filesystem::path& cert_file,
                              const std::string& host) {
  auto load = [](const std::filesystem::path& p, std::string& err) -> Ptr<X509> {
    Ptr<BIO> bio(BIO_new_file(p.c_str(), "r"));
    if (!bio) {
      err = p.string() + ": cannot open";
      return nullptr;
    }
    Ptr<X509> c(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (!c) err = p.string() + ": not a PEM certificate";
    ERR_clear_error();
    return c;
  };
  std::string err;
  auto ca = load(ca_file, err);
  if (!ca) return err;
  auto cert = load(cert_file, err);
  if (!cert) return err;
  Ptr<X509_STORE> store(X509_STORE_new());
  X509_STORE_add_cert(store.get(), ca.get());
  Ptr<X509_STORE_CTX> ctx(X509_STORE_CTX_new());
  X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr);
  if (!host.empty()) {
    X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx.get());
    if (X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) != 1) {
      ERR_clear_error();
      X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
    }
  }
  if (X509_verify_cert(ctx.get()) != 1)
    return cert_file.string() + ": " + X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));
  return "";
}

}  // namespace diaspora
