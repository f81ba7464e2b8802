// RedisProcess: one redis-server that kvtier-bench starts on 127.0.0.1 and stops, for the
// benchmarks whose baseline or store is Redis (peers, remote). Persistence is off
// (--save '' --appendonly no); nothing is written to its --dir.
#pragma once

#include <hiredis/hiredis.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace kvtier::bench {

struct RedisReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyFree>;
struct RedisContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
using RedisContextPtr = std::unique_ptr<redisContext, RedisContextFree>;

// A loopback TCP port free at the moment of asking (the kernel's choice for port 0), never
// 9400 (kvtierd's metrics port). Exits (Die) when no socket can be bound.
int FreeLoopbackPort();

// A blocking hiredis connection to host:port with a 10 s timeout on connecting and on
// each call; exits (Die, naming `what`) when it cannot connect.
RedisContextPtr ConnectRedisOrDie(const std::string& host, int port, const std::string& what);

// Thread-safety: not thread-safe; one owner.
class RedisProcess {
 public:
  // Starts `binary` (PATH is searched) on a free loopback port with `extra_args` after the
  // port, bind and persistence flags, and waits until it answers PING (10 s). nullptr, with
  // `why` set, when it does not start, exits at start or does not answer.
  static std::unique_ptr<RedisProcess> Start(const std::string& binary,
                                             const std::vector<std::string>& extra_args,
                                             std::string* why);
  // SIGTERM, then reaps it. It also gets SIGTERM when kvtier-bench dies (PR_SET_PDEATHSIG).
  ~RedisProcess();
  RedisProcess(const RedisProcess&) = delete;
  RedisProcess& operator=(const RedisProcess&) = delete;

  int port() const { return port_; }

 private:
  RedisProcess(pid_t pid, int port) : pid_(pid), port_(port) {}
  pid_t pid_;
  int port_;
};

}  // namespace kvtier::bench
