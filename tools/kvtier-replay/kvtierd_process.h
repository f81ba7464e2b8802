// A kvtierd the replay starts for itself (the sweep: one fresh daemon a point).
//
// Thread-safety: not thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::replay {

class KvtierdProcess {
 public:
  // Starts `kvtierd_path` with `--socket socket_path --metrics-address off
  // --log-level warn` and `args`, its stdout and stderr into `log_path`, and
  // waits (up to `timeout`) until it answers Health. The daemon dies with this
  // process (PR_SET_PDEATHSIG). Errors: NOT_FOUND (no such executable),
  // UNAVAILABLE (it exited or did not answer; the message holds its log's tail).
  static Result<std::unique_ptr<KvtierdProcess>> Start(const std::string& kvtierd_path,
                                                       const std::string& socket_path,
                                                       const std::vector<std::string>& args,
                                                       const std::string& log_path,
                                                       std::chrono::seconds timeout);
  // Stops it (SIGTERM, then SIGKILL after 10 s) if still running.
  ~KvtierdProcess();
  KvtierdProcess(const KvtierdProcess&) = delete;
  KvtierdProcess& operator=(const KvtierdProcess&) = delete;

  // SIGTERM and wait (SIGKILL after 10 s). Returns its exit status word's meaning:
  // OK for a clean exit 0, INTERNAL naming the exit code or signal otherwise.
  Status Stop();

 private:
  KvtierdProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string log_path_;
};

}  // namespace kvtier::replay
