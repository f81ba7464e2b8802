// kvtierd: the kvtier daemon. See `kvtierd --help` and README.md.
#include <malloc.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>

#include "kvtier/daemon/daemon.h"
#include "kvtier/logging.h"

int main(int argc, char** argv) {
  // Block the stop signals in every thread; the main thread waits for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGHUP);  // no reload yet: a hang-up stops cleanly too
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Requests carry up to a few MiB of token ids: keep freed heap memory instead
  // of returning it to the kernel after every RPC (each return costs page
  // faults and page zeroing on the next request).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);

  spdlog::set_default_logger(spdlog::stderr_color_mt("kvtierd"));  // logs go to stderr
  int exit_code = -1;
  auto options = kvtier::ParseDaemonOptions(argc, argv, &exit_code);
  if (exit_code >= 0) return exit_code;
  if (!options.ok()) {
    std::fprintf(stderr, "kvtierd: %s\n", options.status().message().c_str());
    return 2;
  }
  if (auto st = kvtier::SetLogLevel(options->log_level); !st.ok()) {
    std::fprintf(stderr, "kvtierd: log_level (--log-level): %s\n", st.message().c_str());
    return 2;
  }
  auto daemon = kvtier::Daemon::Start(*options);
  if (!daemon.ok()) {
    spdlog::error("{}", daemon.status().ToString());
    return 1;
  }
  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("{} received, shutting down",
               sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM");
  (*daemon)->Shutdown();
  spdlog::info("stopped");
  return 0;
}
