// `diaspora`: the command-line front end. Exit status: 0 success, 1 runtime failure,
// 2 invalid input or usage (the convention of compilers and linters, so scripts can tell
// "your file is wrong" from "something broke").
#include <CLI/CLI.hpp>

#include <boost/json/serialize.hpp>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "diaspora/core.hpp"
#include "diaspora/policy.hpp"
#include "diaspora/client.hpp"
#include "exec.hpp"
#include "net_commands.hpp"

namespace {

constexpr int kOk = 0;
constexpr int kFailure = 1;
constexpr int kInvalid = 2;

std::string plural(std::size_t n, const std::string& one, const std::string& many = "") {
  return std::to_string(n) + " " + (n == 1 ? one : many.empty() ? one + "s" : many);
}

int cmd_validate(const std::vector<std::string>& files, bool quiet) {
  int bad_files = 0;
  std::size_t errors = 0;
  for (const auto& f : files) {
    auto r = diaspora::load_spec_file(f);
    if (r.ok()) {
      // The policies must also compile into rules (the checks only the resilience engine
      // can make, e.g. phi-accrual on a signal that is not a heartbeat).
      if (auto found = diaspora::resilience::check_policies(*r.spec); !found.empty()) {
        r.diagnostics = std::move(found);
        r.spec.reset();
      }
    }
    for (const auto& d : r.diagnostics) std::cerr << d.str() << "\n";
    errors += r.diagnostics.size();
    if (r.ok()) {
      if (!quiet)
        std::cout << f << ": ok (" << plural(r.spec->sites.size(), "site") << ", "
                  << plural(r.spec->tasks.size(), "task") << ", " << plural(r.spec->policies.size(), "policy", "policies")
                  << ", " << plural(r.spec->rehearsal.size(), "rehearsal job") << ", "
                  << plural(r.spec->faults.size(), "fault") << ")\n";
    } else {
      ++bad_files;
    }
  }
  if (bad_files) {
    std::cerr << plural(errors, "error") << " in " << bad_files << " of " << plural(files.size(), "file") << "\n";
    return kInvalid;
  }
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Diaspora: resilience services for real-time distributed scientific workflows.\n"
               "Docs: docs/ in the source tree; every command has --help.",
               "diaspora"};
  app.set_version_flag("--version", std::string("diaspora ") + diaspora::version_string);
  app.require_subcommand(1);
  app.footer("Exit status: 0 success, 1 runtime failure, 2 invalid input or usage.");

  // validate
  auto* validate = app.add_subcommand("validate", "Check workflow spec files; print every error as FILE:LINE:COL");
  std::vector<std::string> spec_files;
  bool quiet = false;
  validate->add_option("files", spec_files, "Workflow spec files (YAML)")->required()->expected(-1);
  validate->add_flag("-q,--quiet", quiet, "Print only errors");

  // certs
  auto* certs = app.add_subcommand("certs", "Development certificates");
  certs->require_subcommand(1);
  auto* certs_init = certs->add_subcommand(
      "init", "Write a development CA and localhost certificates: ca.pem, ca-key.pem, server.pem, "
              "server-key.pem, client.pem, client-key.pem (keys mode 0600)");
  std::string cert_dir;
  diaspora::DevCertOptions cert_opts;
  std::vector<std::string> extra_dns, extra_ip;
  certs_init->add_option("dir", cert_dir, "Output directory (created if missing)")->required();
  certs_init->add_option("--days", cert_opts.valid_days, "Validity in days")->check(CLI::Range(1, 3650));
  certs_init->add_option("--dns", extra_dns, "Extra DNS name for the server certificate (repeatable)");
  certs_init->add_option("--ip", extra_ip, "Extra IP address for the server certificate (repeatable)");
  certs_init->add_flag("--force", cert_opts.overwrite, "Replace existing files");
  auto* certs_check = certs->add_subcommand("check", "Verify that a certificate chains to a CA and names a host");
  std::string check_ca, check_cert, check_host;
  certs_check->add_option("--ca", check_ca, "CA certificate (PEM)")->required()->check(CLI::ExistingFile);
  certs_check->add_option("cert", check_cert, "Certificate to check (PEM)")->required()->check(CLI::ExistingFile);
  certs_check->add_option("--host", check_host, "Host name or IP address the certificate must name");

  // token
  auto* token = app.add_subcommand("token", "Bearer tokens (JWT, HS256)");
  token->require_subcommand(1);
  auto* token_issue = token->add_subcommand("issue", "Print a signed token");
  std::string secret_file, subject, ttl = "1h", issuer;
  std::vector<std::string> scopes;
  token_issue->add_option("--secret-file", secret_file, "File holding the shared secret")->required();
  token_issue->add_option("--subject", subject, "Who the token is for (sub)")->required();
  token_issue->add_option("--scope", scopes,
                          "Scope, repeatable: publish:<topic-pattern>, subscribe:<topic-pattern>, admin")
      ->required();
  token_issue->add_option("--ttl", ttl, "Lifetime: 90s, 15m, 1h, 7d")->capture_default_str();
  token_issue->add_option("--issuer", issuer, "Issuer (iss)");
  auto* token_verify = token->add_subcommand("verify", "Verify a token and print its claims as JSON");
  std::string verify_token, verify_action, verify_topic;
  token_verify->add_option("--secret-file", secret_file, "File holding the shared secret")->required();
  token_verify->add_option("token", verify_token, "The token")->required();
  token_verify->add_option("--action", verify_action, "Also check this action (publish, subscribe)");
  token_verify->add_option("--topic", verify_topic, "... on this topic");
  auto* token_secret = token->add_subcommand("secret", "Write a new random secret (mode 0600)");
  std::string new_secret;
  bool secret_force = false;
  token_secret->add_option("file", new_secret, "Where to write it")->required();
  token_secret->add_flag("--force", secret_force, "Replace an existing secret");

  auto run_net = diaspora::cli::add_net_commands(app);
  // `diaspora bench ...` is the benchmark program beside this one (built with the benchmarks),
  // so that the CLI itself compiles no benchmark code.
  auto* bench = app.add_subcommand("bench", "Benchmarks (runs diaspora-bench; see `diaspora bench --help`)");
  bench->allow_extras()->prefix_command()->set_help_flag();
  // `diaspora run SPEC ...` is diaspora-run (engine-adapters/run), which links the embedded relay.
  auto* run = app.add_subcommand("run", "Run a workflow spec and keep it alive (runs diaspora-run; see `diaspora run --help`)");
  run->allow_extras()->prefix_command()->set_help_flag();
  // `diaspora exec --spec S --task T -- CMD ...` is diaspora-exec (engine-adapters/exec).
  auto* exec = app.add_subcommand("exec", "Run a command and report its lifecycle through the plugin (runs "
                                          "diaspora-exec; see `diaspora exec --help`)");
  exec->allow_extras()->prefix_command()->set_help_flag();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kOk : kInvalid;
  }

  try {
    if (int rc = run_net(); rc >= 0) return rc;
    if (bench->parsed())
      return diaspora::cli::exec_sibling("diaspora-bench", argv[0], bench->remaining(),
                                         "it is built with the benchmarks: configure with -DDIASPORA_BUILD_BENCH=ON");
    if (run->parsed())
      return diaspora::cli::exec_sibling("diaspora-run", argv[0], run->remaining(),
                                         "it is built with the engine adapters, beside this program");
    if (exec->parsed())
      return diaspora::cli::exec_sibling("diaspora-exec", argv[0], exec->remaining(),
                                         "it is built with the engine adapters, beside this program");
    if (validate->parsed()) return cmd_validate(spec_files, quiet);
    if (certs_init->parsed()) {
      for (auto& d : extra_dns) cert_opts.dns_names.push_back(d);
      for (auto& ip : extra_ip) cert_opts.ip_addresses.push_back(ip);
      auto f = diaspora::write_dev_certificates(cert_dir, cert_opts);
      std::cout << "wrote " << f.ca_cert.string() << ", " << f.server_cert.string() << ", "
                << f.client_cert.string() << " and their keys (mode 0600)\n";
      return kOk;
    }
    if (certs_check->parsed()) {
      std::string why = diaspora::check_certificate(check_ca, check_cert, check_host);
      if (!why.empty()) {
        std::cerr << "error: " << why << "\n";
        return kInvalid;
      }
      std::cout << check_cert << ": ok\n";
      return kOk;
    }
    if (token_issue->parsed()) {
      std::string secret = diaspora::load_secret_file(secret_file);
      diaspora::TokenClaims c;
      c.subject = subject;
      c.scopes = scopes;
      c.issued_at = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
      try {
        c.expires_at = c.issued_at + diaspora::parse_ttl(ttl);
      } catch (const diaspora::Error& e) {
        std::cerr << "error: --ttl: " << e.what() << "\n";
        return kInvalid;
      }
      if (!issuer.empty()) c.issuer = issuer;
      for (const auto& s : scopes)
        if (s != "admin" && !s.starts_with("publish:") && !s.starts_with("subscribe:") && !s.starts_with("control:")) {
          std::cerr << "error: --scope '" << s << "': use publish:<pattern>, subscribe:<pattern>, control:<pattern> or admin\n";
          return kInvalid;
        }
      std::cout << diaspora::issue_token(secret, c) << "\n";
      return kOk;
    }
    if (token_verify->parsed()) {
      diaspora::TokenVerifier v(diaspora::load_secret_file(secret_file));
      const diaspora::TokenClaims c = verify_action.empty() ? v.verify(verify_token)
                                                            : v.authorize(verify_token, verify_action, verify_topic);
      std::cout << c.payload_json << "\n";  // the claims exactly as the token carries them
      return kOk;
    }
    if (token_secret->parsed()) {
      diaspora::write_secret_file(new_secret, secret_force);
      std::cout << "wrote " << new_secret << " (mode 0600)\n";
      return kOk;
    }
  } catch (const diaspora::TokenError& e) {
    std::cerr << "error: " << e.what() << " [" << diaspora::to_string(e.code()) << "]\n";
    return kInvalid;
  } catch (const diaspora::RelayClientError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kFailure;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kFailure;
  }
  return kFailure;
}
