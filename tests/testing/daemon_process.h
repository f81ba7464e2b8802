// Test helpers that run the real kvtier binaries as child processes (never
// linked into production targets).
//
//   TempDir        a fresh 0700 directory under /tmp, removed with its contents.
//   RunCommand     runs a program to completion (bounded) and captures its
//                  stdout, stderr and exit status.
//   ChildProcess   a long-running child whose stdout/stderr go to files; killed
//                  (SIGKILL) on destruction if still running.
//   DaemonProcess  the real kvtierd on a socket: Start() waits (bounded) until
//                  `kvtierctl health` succeeds; Stop() sends SIGTERM and waits
//                  (SIGKILL after a timeout); Kill9(); Restart(). The destructor
//                  stops it the same way, so no daemon outlives a failed test.
//
// Children are started with fork+exec and PR_SET_PDEATHSIG(SIGKILL), so they
// also die when the test process itself is killed (e.g. by a ctest timeout).
//
// Sanitizer builds (make test-asan / test-tsan): a sanitizer report (ASan,
// LSan, UBSan, TSan) in what a child wrote to stderr fails the current test
// (ADD_FAILURE, with the report), whether or not the test looks at the child's
// exit: RunCommand checks its stderr, ChildProcess (so DaemonProcess) what the
// child appended to its stderr file, each time it reaps the child.
//
// Binaries are found in $KVTIER_BIN_DIR (set by tests/CMakeLists.txt), else
// next to the test executable.
//
// Thread-safety: none of these classes is thread-safe; use each from one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::testing {

// Directory holding kvtierd, kvtierctl, kvtier-replay and kvtier_test_client.
std::string BinDir();
// BinDir() + "/" + name.
std::string BinPath(const std::string& name);

// The first sanitizer report in `text` (from its first line with a sanitizer's
// ERROR or SUMMARY, a ThreadSanitizer WARNING, or a UBSan "runtime error:"), at
// most 16 KiB of it; "" when there is none.
std::string SanitizerReport(std::string_view text);

// Whole contents of the file at `path` ("" when it cannot be read).
std::string ReadFileOrEmpty(const std::string& path);
// Writes `text` to `path` (truncating). Returns false on failure.
bool WriteFile(const std::string& path, const std::string& text);

class TempDir {
 public:
  // Creates /tmp/<prefix>.XXXXXX (mode 0700). Aborts the test binary if it cannot.
  explicit TempDir(const std::string& prefix = "kvtier-test");
  ~TempDir();  // rm -rf
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// How a finished child ended.
#ifdef KVTIER_DATA_ROOT_DEFAULT
// The conversation trace shipped in data/traces ($KVTIER_DATA_ROOT overrides the checkout).
inline std::string ConversationTracePath() {
  const char* root = std::getenv("KVTIER_DATA_ROOT");
  return std::string(root ? root : KVTIER_DATA_ROOT_DEFAULT) +
         "/data/traces/conversation_trace.jsonl";
}
#endif

struct ExitInfo {
  bool exited = false;  // returned from main / called exit (WIFEXITED)
  int exit_code = -1;   // WEXITSTATUS when exited
  int term_signal = 0;  // WTERMSIG when killed by a signal
  std::string ToString() const;
};

struct CommandResult {
  ExitInfo exit;
  bool timed_out = false;  // killed with SIGKILL after the timeout
  std::string out;
  std::string err;
  std::chrono::milliseconds elapsed{0};
  // True when the program exited by itself with code 0.
  bool ok() const { return !timed_out && exit.exited && exit.exit_code == 0; }
  std::string Describe() const;  // exit info + stdout + stderr, for failure messages
};

// Runs argv[0] (a path) with argv to completion; kills it after `timeout`.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         std::chrono::milliseconds timeout = std::chrono::seconds(30));

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();  // SIGKILL + reap if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts argv (argv[0] is a path); stdout/stderr are appended to the given
  // files. Returns false (and sets *error) when fork fails or the program
  // cannot be executed (exit code 127 seen at once is reported by Wait()).
  // `cwd`: the child's working directory ("" = ours).
  bool Spawn(const std::vector<std::string>& argv, const std::string& stdout_path,
             const std::string& stderr_path, std::string* error, const std::string& cwd = "");

  pid_t pid() const { return pid_; }
  bool running();  // reaps the child when it has exited
  // Sends `sig` if running. Returns false when there is no running child.
  bool Signal(int sig);
  // Waits up to `timeout` for the child to exit; nullopt when it is still running.
  std::optional<ExitInfo> Wait(std::chrono::milliseconds timeout);
  // SIGTERM, wait `grace`, then SIGKILL and wait. The child's exit info.
  ExitInfo Terminate(std::chrono::milliseconds grace);
  // SIGKILL and reap.
  ExitInfo Kill();
  // Exit info of the last reaped child, if any.
  const std::optional<ExitInfo>& last_exit() const { return last_exit_; }

 private:
  // Records how the reaped child ended and checks its new stderr for a sanitizer report.
  void Reaped(int wait_status);

  pid_t pid_ = -1;
  std::optional<ExitInfo> last_exit_;
  std::string program_;          // argv[0] of the running child
  std::string stderr_path_;      // its stderr file
  uintmax_t stderr_offset_ = 0;  // that file's size when the child started
};

class DaemonProcess {
 public:
  struct Options {
    // gRPC socket path. Required.
    std::string socket_path;
    // Default: "64MiB".
    std::string dram_bytes = "64MiB";
    // More kvtierd flags, e.g. {"--lease-ttl-ms", "600000"}. Without
    // --nvme-path or --nvme-bytes among them, "--nvme-bytes 0" is added (DRAM
    // only); without --metrics-address, "--metrics-address off" unless
    // metrics_off is false (then kvtierd's default address).
    std::vector<std::string> extra_args;
    bool metrics_off = true;
    // The daemon's working directory (where ./kvtier-data goes). Default: ours.
    std::string working_dir;
    // Where the daemon's stdout+stderr go. Default: socket_path + ".log".
    std::string log_path;
    // Longest wait for `kvtierctl health` to succeed. Default: 20 s.
    std::chrono::milliseconds start_timeout{20000};
    // SIGTERM grace before SIGKILL in Stop() and the destructor. Default: 10 s.
    std::chrono::milliseconds stop_timeout{10000};
  };

  explicit DaemonProcess(Options options);
  ~DaemonProcess();  // Stop() when running
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Starts kvtierd and waits until it serves. Returns "" on success, else why
  // not (including the daemon's log).
  std::string Start();
  // SIGTERM and wait (SIGKILL after stop_timeout). The exit info.
  ExitInfo Stop();
  // SIGKILL and reap (no clean shutdown: socket files stay behind).
  ExitInfo Kill9();
  // Stop() if running, then Start() with the same options.
  std::string Restart();

  bool running() { return child_.running(); }
  pid_t pid() const { return child_.pid(); }
  const std::string& socket_path() const { return options_.socket_path; }
  std::string log() const { return ReadFileOrEmpty(options_.log_path); }
  // The kvtierd command line Start() runs.
  std::vector<std::string> Argv() const;

  // `kvtierctl --socket <ours> <args...>` with a bounded timeout.
  CommandResult Ctl(const std::vector<std::string>& args,
                    std::chrono::milliseconds timeout = std::chrono::seconds(20)) const;

 private:
  Options options_;
  ChildProcess child_;
};

}  // namespace kvtier::testing
