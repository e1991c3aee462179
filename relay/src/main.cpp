// diaspora-relay: serve the event fabric on one TLS port until SIGTERM/SIGINT; SIGHUP loads
// the certificate and key again.
#include <CLI/CLI.hpp>

#include <sys/resource.h>

#include <csignal>
#include <iostream>

#include "diaspora/relay.hpp"
#include "diaspora/spec.hpp"
#include "diaspora/version.hpp"

int main(int argc, char** argv) {
  CLI::App app{"diaspora-relay: the Diaspora event fabric — a durable, authenticated event log served over\n"
               "TLS WebSockets (diaspora.v1, cloudevents.json) and HTTPS. See docs/protocol.md.",
               "diaspora-relay"};
  app.set_version_flag("--version", std::string("diaspora-relay ") + diaspora::version_string);
  std::string config_file, listen, data_dir, cert, key, client_ca, secret, port_file, fsync;
  app.add_option("--config", config_file, "relay.yaml (schemas/relay.schema.json); flags override it")
      ->check(CLI::ExistingFile);
  app.add_option("--listen", listen, "HOST:PORT to listen on; port 0 picks a free port (default 127.0.0.1:7443)");
  app.add_option("--data-dir", data_dir, "Log directory (default .diaspora/relay)");
  app.add_option("--tls-cert", cert, "Server certificate chain (PEM)");
  app.add_option("--tls-key", key, "Server private key (PEM)");
  app.add_option("--client-ca", client_ca, "Require client certificates signed by this CA (mutual TLS)");
  app.add_option("--auth-secret-file", secret, "HS256 secret that signs client tokens");
  app.add_option("--port-file", port_file, "Write the bound port here once listening");
  app.add_option("--fsync", fsync, "always (default: ack after the batch is on stable storage) | never | interval:<ms>");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  diaspora::RelayConfig cfg;
  try {
    if (!config_file.empty()) cfg = diaspora::load_relay_config(config_file);
  } catch (const diaspora::SpecError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  if (!listen.empty()) cfg.listen = listen;
  if (!data_dir.empty()) cfg.data_dir = data_dir;
  if (!cert.empty()) cfg.tls_cert = cert;
  if (!key.empty()) cfg.tls_key = key;
  if (!client_ca.empty()) cfg.client_ca = client_ca;
  if (!secret.empty()) cfg.auth_secret_file = secret;
  if (!port_file.empty()) cfg.port_file = port_file;
  if (!fsync.empty()) cfg.fsync = fsync;

  // Every segment of every topic holds a descriptor: take all the open files the hard
  // limit allows (a soft limit of 1024 is common and too low for a long log).
  if (rlimit nofile{}; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }

  // Block the signals before any thread starts, then wait for one on this thread.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);  // reload the certificate and key
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  try {
    diaspora::validate_relay_config(cfg);
  } catch (const std::exception& e) {
    std::cerr << "diaspora-relay: error: " << e.what() << "\n";
    return 2;
  }
  try {
    diaspora::Relay relay(cfg);
    relay.start();
    std::cerr << "diaspora-relay " << diaspora::version_string << " listening on port " << relay.port() << " (data "
              << cfg.data_dir.string() << ", fsync " << cfg.fsync << ")\n";
    int sig = 0;
    while (sigwait(&set, &sig) == 0 && sig == SIGHUP) {
      try {
        relay.reload_tls();
        std::cerr << "diaspora-relay: SIGHUP: certificate and key loaded again from " << cfg.tls_cert.string() << "\n";
      } catch (const std::exception& e) {
        std::cerr << "diaspora-relay: SIGHUP: " << e.what() << "; still serving the previous certificate\n";
      }
    }
    std::cerr << "diaspora-relay: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ": draining and flushing\n";
    relay.stop();
    std::cerr << "diaspora-relay: stopped cleanly\n";
    return 0;
  } catch (const diaspora::RelayConfigError& e) {
    std::cerr << "diaspora-relay: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "diaspora-relay: error: " << e.what() << "\n";
    return 1;
  }
}
