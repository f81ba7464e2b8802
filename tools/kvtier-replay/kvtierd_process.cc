#include "kvtierd_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "kvtier/admin_client.h"

namespace kvtier::replay {
namespace {

std::string LogTail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.size() > 2000) s = "..." + s.substr(s.size() - 2000);
  return s.empty() ? "(its log is empty)" : "its log:\n" + s;
}

std::string DescribeWait(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

}  // namespace

Result<std::unique_ptr<KvtierdProcess>> KvtierdProcess::Start(const std::string& kvtierd_path,
                                                              const std::string& socket_path,
                                                              const std::vector<std::string>& args,
                                                              const std::string& log_path,
                                                              std::chrono::seconds timeout) {
  if (access(kvtierd_path.c_str(), X_OK) != 0) {
    return Status::NotFound("kvtierd " + kvtierd_path + " is not an executable: " +
                            std::strerror(errno) + " (give --kvtierd PATH)");
  }
  std::vector<std::string> argv = {kvtierd_path, "--socket",    socket_path, "--metrics-address",
                                   "off",        "--log-level", "warn"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return Status::Unavailable("cannot write " + log_path + ": " + std::strerror(errno));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();  // after it, only async-signal-safe calls in the child
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    const int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(log_fd);
  if (pid < 0) return Status::Unavailable(std::string("fork: ") + std::strerror(errno));
  std::unique_ptr<KvtierdProcess> p(new KvtierdProcess(pid, log_path));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      p->pid_ = -1;
      return Status::Unavailable("kvtierd " + DescribeWait(status) + " at start; " +
                                 LogTail(log_path));
    }
    if (access(socket_path.c_str(), F_OK) == 0) {
      auto admin = AdminClient::Connect(socket_path, std::chrono::seconds(1));
      if (admin.ok() && (*admin)->Health().ok()) return p;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::Unavailable("kvtierd did not answer at " + socket_path + " within " +
                             std::to_string(timeout.count()) + " s; " + LogTail(log_path));
}

Status KvtierdProcess::Stop() {
  if (pid_ <= 0) return Status::Ok();
  kill(pid_, SIGTERM);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_ = -1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  return Status::Internal("kvtierd " + DescribeWait(status) + " when stopped; " +
                          LogTail(log_path_));
}

KvtierdProcess::~KvtierdProcess() { (void)Stop(); }

}  // namespace kvtier::replay
