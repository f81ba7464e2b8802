// kvtierd: the kvtier daemon. See `kvtierd --help` and README.md.
#include <malloc.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "kvtier/daemon/daemon.h"
#include "kvtier/logging.h"

namespace {

const char* SignalName(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM";
}

}  // namespace

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

  kvtier::LogToStderr("kvtierd");  // logs go to stderr
  int exit_code = -1;
  auto options = kvtier::ParseDaemonOptions(argc, argv, &exit_code);
  if (exit_code >= 0) return exit_code;
  if (!options.ok()) {
    std::fprintf(stderr, "kvtierd: %s\n", options.status().message().c_str());
    return 2;
  }
  if (auto st = kvtier::SetLogLevel(options->log_level); !st.ok()) {
    std::fprintf(stderr, "kvtierd: --log-level: %s\n", st.message().c_str());  // checked above
    return 2;
  }
  auto daemon = kvtier::Daemon::Start(*options);
  if (!daemon.ok()) {  // worded as a parse error is (those exit 2: nothing could be read)
    spdlog::default_logger()->flush();
    std::fprintf(stderr, "kvtierd: cannot start: %s\n", daemon.status().message().c_str());
    return 1;
  }
  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("{} received, shutting down (a second signal stops without the NVMe drain)",
               SignalName(sig));
  // A second signal ends the drain at once; should even that hang (an NVMe
  // write that never returns), the process exits 5 s later with what is durable.
  static std::atomic<bool> abort_drain{false};
  std::thread([stop] {
    int again = 0;
    sigwait(&stop, &again);
    spdlog::warn("{} received again: stopping without waiting for NVMe writes", SignalName(again));
    abort_drain.store(true);
    std::this_thread::sleep_for(std::chrono::seconds(5));
    spdlog::error("shutdown did not finish 5 s after the second signal; exiting now");
    _exit(1);
  }).detach();
  // Exit 3: stopped, but the drain was cut short and committed chunks were not
  // written to NVMe (a supervisor can tell it from a complete stop).
  const size_t cut_short = (*daemon)->Shutdown(&abort_drain);
  spdlog::info("stopped");
  return cut_short > 0 ? 3 : 0;
}
