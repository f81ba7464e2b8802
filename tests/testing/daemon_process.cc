#include "testing/daemon_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace kvtier::testing {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

ExitInfo FromWaitStatus(int status) {
  ExitInfo e;
  if (WIFEXITED(status)) {
    e.exited = true;
    e.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    e.term_signal = WTERMSIG(status);
  }
  return e;
}

// Forks and execs argv with stdout/stderr on `out_fd`/`err_fd` (-1: /dev/null).
// The child dies with the parent (PR_SET_PDEATHSIG). Returns the pid or -errno.
pid_t ForkExec(const std::vector<std::string>& argv, int out_fd, int err_fd,
               const std::string& cwd = "") {
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // the parent died before prctl
    const int devnull = open("/dev/null", O_RDWR);
    dup2(devnull, 0);
    dup2(out_fd >= 0 ? out_fd : devnull, 1);
    dup2(err_fd >= 0 ? err_fd : devnull, 2);
    if (close_range(3, ~0U, 0) != 0) {
      for (int fd = 3; fd < 4096; ++fd) close(fd);
    }
    // The test process may block signals (e.g. gRPC); give the child a clean mask.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(126);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

std::string ReadFd(int fd) {
  std::string s;
  if (lseek(fd, 0, SEEK_SET) != 0) return s;
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    s.append(buf, static_cast<size_t>(n));
  }
  return s;
}

// Text of the file at `path` from byte `offset` on ("" when it cannot be read).
std::string ReadFileFrom(const std::string& path, uintmax_t offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in || !in.seekg(static_cast<std::streamoff>(offset))) return "";
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void FailOnSanitizerReport(const std::string& program, const ExitInfo& exit,
                           const std::string& where, std::string_view text) {
  const std::string report = SanitizerReport(text);
  if (report.empty()) return;
  ADD_FAILURE() << program << " (" << exit.ToString() << ") wrote a sanitizer report to " << where
                << ":\n"
                << report;
}

}  // namespace

std::string SanitizerReport(std::string_view text) {
  constexpr size_t kMaxReportBytes = 16 * 1024;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    // TSan reports start with WARNING; ASan's WARNINGs (e.g. a failed huge allocation with
    // allocator_may_return_null=1) are not reports.
    const bool sanitizer_line = line.find("Sanitizer") != std::string_view::npos &&
                                (line.find("ERROR:") != std::string_view::npos ||
                                 line.find("SUMMARY:") != std::string_view::npos ||
                                 line.find("WARNING: ThreadSanitizer") != std::string_view::npos);
    if (sanitizer_line || line.find(": runtime error: ") != std::string_view::npos) {
      return std::string(text.substr(pos, kMaxReportBytes));
    }
    pos = end + 1;
  }
  return "";
}

std::string BinDir() {
  if (const char* d = std::getenv("KVTIER_BIN_DIR"); d != nullptr && d[0] != '\0') return d;
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : exe.parent_path().string();
}

std::string BinPath(const std::string& name) { return BinDir() + "/" + name; }

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + ".XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string ExitInfo::ToString() const {
  if (exited) return "exit code " + std::to_string(exit_code);
  if (term_signal != 0) {
    return "killed by signal " + std::to_string(term_signal) + " (" + strsignal(term_signal) + ")";
  }
  return "not exited";
}

std::string CommandResult::Describe() const {
  return (timed_out ? std::string("TIMED OUT, ") : std::string()) + exit.ToString() + " after " +
         std::to_string(elapsed.count()) + " ms\n--- stdout ---\n" + out + "\n--- stderr ---\n" +
         err;
}

CommandResult RunCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  CommandResult r;
  const int out_fd = memfd_create("kvtier-test-stdout", MFD_CLOEXEC);
  const int err_fd = memfd_create("kvtier-test-stderr", MFD_CLOEXEC);
  const auto start = Clock::now();
  const pid_t pid = ForkExec(argv, out_fd, err_fd);
  if (pid < 0) {
    r.err = std::string("fork: ") + std::strerror(-pid);
    close(out_fd);
    close(err_fd);
    return r;
  }
  int status = 0;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (Clock::now() - start > timeout) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  r.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  r.exit = FromWaitStatus(status);
  r.out = ReadFd(out_fd);
  r.err = ReadFd(err_fd);
  close(out_fd);
  close(err_fd);
  FailOnSanitizerReport(argv.empty() ? "?" : argv[0], r.exit, "stderr", r.err);
  return r;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) Kill();
}

bool ChildProcess::Spawn(const std::vector<std::string>& argv, const std::string& stdout_path,
                         const std::string& stderr_path, std::string* error,
                         const std::string& cwd) {
  if (pid_ > 0) {
    *error = "a child is already running";
    return false;
  }
  const int out_fd = open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  const int err_fd =
      stderr_path == stdout_path
          ? out_fd
          : open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (out_fd < 0 || err_fd < 0) {
    *error = "cannot open " + stdout_path + " / " + stderr_path + ": " + std::strerror(errno);
    if (out_fd >= 0) close(out_fd);
    if (err_fd >= 0 && err_fd != out_fd) close(err_fd);
    return false;
  }
  struct stat err_stat;
  stderr_offset_ = fstat(err_fd, &err_stat) == 0 ? static_cast<uintmax_t>(err_stat.st_size) : 0;
  stderr_path_ = stderr_path;
  program_ = argv.empty() ? "?" : argv[0];
  const pid_t pid = ForkExec(argv, out_fd, err_fd, cwd);
  close(out_fd);
  if (err_fd != out_fd) close(err_fd);
  if (pid < 0) {
    *error = std::string("fork: ") + std::strerror(-pid);
    return false;
  }
  pid_ = pid;
  last_exit_.reset();
  return true;
}

bool ChildProcess::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  const pid_t w = waitpid(pid_, &status, WNOHANG);
  if (w == pid_) {
    Reaped(status);
    return false;
  }
  return true;
}

void ChildProcess::Reaped(int wait_status) {
  last_exit_ = FromWaitStatus(wait_status);
  pid_ = -1;
  FailOnSanitizerReport(program_, *last_exit_, stderr_path_,
                        ReadFileFrom(stderr_path_, stderr_offset_));
}

bool ChildProcess::Signal(int sig) {
  if (!running()) return false;
  return kill(pid_, sig) == 0;
}

std::optional<ExitInfo> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (!running()) return last_exit_;
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(5ms);
  }
}

ExitInfo ChildProcess::Terminate(std::chrono::milliseconds grace) {
  if (!Signal(SIGTERM)) return last_exit_.value_or(ExitInfo{});
  if (auto e = Wait(grace)) return *e;
  return Kill();
}

ExitInfo ChildProcess::Kill() {
  if (pid_ <= 0) return last_exit_.value_or(ExitInfo{});
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  Reaped(status);
  return *last_exit_;
}

DaemonProcess::DaemonProcess(Options options) : options_(std::move(options)) {
  if (options_.log_path.empty()) options_.log_path = options_.socket_path + ".log";
}

DaemonProcess::~DaemonProcess() {
  if (child_.running()) Stop();
}

std::vector<std::string> DaemonProcess::Argv() const {
  std::vector<std::string> argv = {BinPath("kvtierd"), "--socket", options_.socket_path,
                                   "--dram-bytes", options_.dram_bytes};
  argv.insert(argv.end(), options_.extra_args.begin(), options_.extra_args.end());
  // kvtierd's NVMe tier is on by default (8 GiB under ./kvtier-data): tests
  // that want it say where and how big.
  const bool nvme_given =
      std::any_of(options_.extra_args.begin(), options_.extra_args.end(),
                  [](const std::string& a) { return a == "--nvme-path" || a == "--nvme-bytes"; });
  if (!nvme_given) argv.insert(argv.end(), {"--nvme-bytes", "0"});
  // Its /metrics listens on 127.0.0.1:9400 by default, one daemon per machine:
  // tests that scrape it give their own address.
  if (options_.metrics_off && std::find(options_.extra_args.begin(), options_.extra_args.end(),
                                        "--metrics-address") == options_.extra_args.end()) {
    argv.insert(argv.end(), {"--metrics-address", "off"});
  }
  return argv;
}

CommandResult DaemonProcess::Ctl(const std::vector<std::string>& args,
                                 std::chrono::milliseconds timeout) const {
  std::vector<std::string> argv = {BinPath("kvtierctl"), "--socket", options_.socket_path};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, timeout);
}

std::string DaemonProcess::Start() {
  if (child_.running()) return "kvtierd is already running";
  std::string error;
  if (!child_.Spawn(Argv(), options_.log_path, options_.log_path, &error, options_.working_dir)) {
    return error;
  }
  const auto deadline = Clock::now() + options_.start_timeout;
  std::string last;
  while (Clock::now() < deadline) {
    if (!child_.running()) {
      return "kvtierd exited during start-up (" +
             child_.last_exit().value_or(ExitInfo{}).ToString() + "); log:\n" + log();
    }
    // The socket appears just before gRPC serves; only ask once it exists.
    struct stat st;
    if (stat(options_.socket_path.c_str(), &st) == 0) {
      CommandResult h = Ctl({"--timeout-ms", "1000", "health"}, std::chrono::seconds(10));
      if (h.ok()) return "";
      last = h.Describe();
    }
    std::this_thread::sleep_for(25ms);
  }
  child_.Kill();
  return "kvtierd did not become healthy within " + std::to_string(options_.start_timeout.count()) +
         " ms; last health check: " + last + "\nlog:\n" + log();
}

ExitInfo DaemonProcess::Stop() { return child_.Terminate(options_.stop_timeout); }

ExitInfo DaemonProcess::Kill9() { return child_.Kill(); }

std::string DaemonProcess::Restart() {
  if (child_.running()) Stop();
  return Start();
}

}  // namespace kvtier::testing
