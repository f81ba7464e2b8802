#include "redis_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "bench_common.h"

namespace kvtier::bench {

int FreeLoopbackPort() {
  constexpr int kReservedPort = 9400;  // kvtierd's metrics port: never ours
  for (;;) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) Die(std::string("socket: ") + std::strerror(errno));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      Die(std::string("bind a loopback port: ") + std::strerror(errno));
    }
    const int port = ntohs(a.sin_port);
    close(fd);
    if (port != kReservedPort) return port;
  }
}

RedisContextPtr ConnectRedisOrDie(const std::string& host, int port, const std::string& what) {
  const timeval tv{10, 0};
  RedisContextPtr c(redisConnectWithTimeout(host.c_str(), port, tv));
  if (c == nullptr || c->err != 0) {
    Die(what + ": connect to " + host + ":" + std::to_string(port) + ": " +
        (c != nullptr ? c->errstr : "out of memory"));
  }
  redisSetTimeout(c.get(), tv);
  return c;
}

std::unique_ptr<RedisProcess> RedisProcess::Start(const std::string& binary,
                                                  const std::vector<std::string>& extra_args,
                                                  std::string* why) {
  // Nothing is written there (no snapshots, no append-only file), but Redis wants one.
  const std::string dir = std::filesystem::temp_directory_path().string();
  const int port = FreeLoopbackPort();
  std::vector<std::string> argv = {binary, "--port", std::to_string(port), "--bind", "127.0.0.1"};
  for (const char* a : {"--save", "", "--appendonly", "no", "--loglevel", "warning"}) {
    argv.emplace_back(a);
  }
  argv.insert(argv.end(), {"--dir", dir});
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> args;  // built before fork(): the child only execs
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    *why = std::string("fork: ") + std::strerror(errno);
    return nullptr;
  }
  if (pid == 0) {
    // Stopped with the benchmark, even when it exits early (and if it already has).
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    if (const int null = open("/dev/null", O_WRONLY); null >= 0) dup2(null, STDOUT_FILENO);
    execvp(args[0], args.data());
    _exit(127);
  }
  std::unique_ptr<RedisProcess> process(new RedisProcess(pid, port));
  const auto t0 = Clock::now();
  while (Seconds(Clock::now() - t0) < 10) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      process->pid_ = -1;
      *why = binary + (!WIFEXITED(status) ? " was killed at start (signal " +
                                                std::to_string(WTERMSIG(status)) + ")"
                       : WEXITSTATUS(status) == 127
                           ? " could not be run (not found, or not executable)"
                           : " exited at start with code " + std::to_string(WEXITSTATUS(status)));
      return nullptr;
    }
    RedisContextPtr c(redisConnect("127.0.0.1", port));
    if (c != nullptr && c->err == 0) {
      RedisReplyPtr pong(static_cast<redisReply*>(redisCommand(c.get(), "PING")));
      if (pong && pong->type == REDIS_REPLY_STATUS) return process;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  *why = binary + " did not answer PING within 10 s";
  return nullptr;
}

RedisProcess::~RedisProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
}

}  // namespace kvtier::bench
