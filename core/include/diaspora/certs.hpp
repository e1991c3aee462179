// Development certificates: a private CA and localhost server/client certificates made
// with OpenSSL's library API, so a fresh machine runs the relay with real TLS at once.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "diaspora/error.hpp"

namespace diaspora {

struct DevCertOptions {
  std::vector<std::string> dns_names = {"localhost"};           ///< server SAN DNS entries
  std::vector<std::string> ip_addresses = {"127.0.0.1", "::1"};  ///< server SAN IP entries
  int valid_days = 365;
  std::string client_name = "diaspora-client";  ///< CN of the client certificate
  bool overwrite = false;  ///< replace existing files instead of refusing
};

/// Files written by write_dev_certificates, all PEM.
struct DevCertFiles {
  std::filesystem::path ca_cert, ca_key, server_cert, server_key, client_cert, client_key;
};

/// Creates `dir` if needed and writes ca.pem, ca-key.pem, server.pem, server-key.pem,
/// client.pem and client-key.pem: ECDSA P-256 keys, SHA-256 signatures, the server
/// certificate with SANs for the DNS names and IP addresses (serverAuth), the client
/// certificate for mutual TLS (clientAuth). Keys are written with mode 0600 and every
/// file atomically (temporary file + rename). Throws Error when a file exists and
/// `overwrite` is false (nothing is written then), or on any OpenSSL or I/O failure.
/// Thread-safe (uses no global state besides OpenSSL's own).
DevCertFiles write_dev_certificates(const std::filesystem::path& dir, const DevCertOptions& options = {});

/// Verifies that `cert_file` chains to `ca_file` and is valid now; when `host` is not
/// empty, also that it names `host` (DNS name or IP address). Returns an empty string
/// when all holds, otherwise the reason. Used by tests and `diaspora certs check`.
std::string check_certificate(const std::filesystem::path& ca_file, const std::filesystem::path& cert_file,
                              const std::string& host = "");

}  // namespace diaspora
