#include "testing/redis_servers.h"

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "testing/daemon_process.h"

namespace kvtier::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kStartAttempts = 5;
constexpr uint16_t kReservedPort = 9400;  // kvtierd's metrics port: never ours

// A port that was free on 127.0.0.1 a moment ago; 0 when none could be bound.
uint16_t FreePort() {
  for (int attempt = 0; attempt < 20; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    uint16_t port = 0;
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    close(fd);
    if (port != 0 && port != kReservedPort) return port;
  }
  return 0;
}

// redis-server's path: the first in $PATH, else /usr/bin's.
std::string RedisServerPath() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string p = dir + "/redis-server";
    if (!dir.empty() && access(p.c_str(), X_OK) == 0) return p;
  }
  return "/usr/bin/redis-server";
}

RedisValue Copy(const redisReply& r) {
  RedisValue v;
  switch (r.type) {
    case REDIS_REPLY_STRING:
      v.type = RedisValue::Type::kString;
      break;
    case REDIS_REPLY_STATUS:
      v.type = RedisValue::Type::kStatus;
      break;
    case REDIS_REPLY_ERROR:
      v.type = RedisValue::Type::kError;
      break;
    case REDIS_REPLY_INTEGER:
      v.type = RedisValue::Type::kInteger;
      break;
    case REDIS_REPLY_ARRAY:
      v.type = RedisValue::Type::kArray;
      break;
    default:
      v.type = RedisValue::Type::kNil;
      break;
  }
  if (r.str != nullptr) v.str.assign(r.str, r.len);
  v.integer = r.integer;
  for (size_t i = 0; i < r.elements; ++i) {
    if (r.element[i] != nullptr) v.elements.push_back(Copy(*r.element[i]));
  }
  return v;
}

// "field:value" of an INFO or CLUSTER INFO answer; "" when absent.
std::string Field(const RedisValue& info, const std::string& field) {
  std::stringstream lines(info.str);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind(field + ":", 0) == 0) return line.substr(field.size() + 1);
  }
  return "";
}

bool IsOk(const Result<RedisValue>& v) {
  return v.ok() && v->type == RedisValue::Type::kStatus && v->str == "OK";
}

Status Failed(const std::string& what, const Result<RedisValue>& v) {
  return Status::Internal(what + ": " + (v.ok() ? v->ToString() : v.status().ToString()));
}

}  // namespace

std::string RedisValue::ToString() const {
  switch (type) {
    case Type::kNil:
      return "nil";
    case Type::kString:
      return "string '" + str + "'";
    case Type::kStatus:
      return "status '" + str + "'";
    case Type::kError:
      return "error '" + str + "'";
    case Type::kInteger:
      return "integer " + std::to_string(integer);
    case Type::kArray: {
      std::string s = "[";
      for (size_t i = 0; i < elements.size(); ++i) s += (i ? ", " : "") + elements[i].ToString();
      return s + "]";
    }
  }
  return "?";
}

struct RedisServers::Node {
  TempDir dir{"kvtier-redis"};
  ChildProcess child;
  uint16_t port = 0;
  uint16_t cluster_port = 0;
  std::string id;
  int replica_of = -1;
  bool stopped = true;
};

RedisServers::RedisServers(bool cluster) : cluster_(cluster) {}

RedisServers::~RedisServers() { StopAll(); }

uint16_t RedisServers::port(size_t i) const { return nodes_.at(i)->port; }
const std::string& RedisServers::node_id(size_t i) const { return nodes_.at(i)->id; }
int RedisServers::replica_of(size_t i) const { return nodes_.at(i)->replica_of; }
bool RedisServers::running(size_t i) {
  return !nodes_.at(i)->stopped && nodes_[i]->child.running();
}
std::string RedisServers::Log(size_t i) const {
  return ReadFileOrEmpty(nodes_.at(i)->dir.Sub("redis.log"));
}

std::vector<RedisEndpoint> RedisServers::Seeds() const {
  std::vector<RedisEndpoint> seeds;
  for (size_t i = 0; i < nodes_.size(); ++i) seeds.push_back(endpoint(i));
  return seeds;
}

std::string RedisServers::Url() const {
  std::string url = "redis://";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    url += (i ? "," : "") + endpoint(i).ToString();
  }
  return url;
}

Result<RedisValue> RedisServers::Run(size_t i, const std::vector<std::string>& argv,
                                     milliseconds timeout) const {
  const std::string name =
      "redis node " + std::to_string(i) + " (port " + std::to_string(port(i)) + ")";
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port(i), tv);
  if (c == nullptr || c->err != 0) {
    std::string why = c != nullptr ? c->errstr : "out of memory";
    redisFree(c);
    return Status::Unavailable(name + ": connect: " + why);
  }
  redisSetTimeout(c, tv);
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(args.size()), args.data(), lens.data()));
  if (r == nullptr) {
    std::string why = c->errstr;
    redisFree(c);
    return Status::Unavailable(name + ": " + argv.at(0) + ": " + why);
  }
  RedisValue v = Copy(*r);
  freeReplyObject(r);
  redisFree(c);
  return v;
}

Status RedisServers::StartNode(size_t i) {
  Node& n = *nodes_[i];
  std::string last_error;
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    if (n.port == 0 || attempt > 0) {
      n.port = FreePort();
      n.cluster_port = FreePort();
      if (n.port == 0 || n.cluster_port == 0 || n.port == n.cluster_port) continue;
    }
    std::vector<std::string> argv = {RedisServerPath(), "--port", std::to_string(n.port), "--bind",
                                     ipv6_ ? "127.0.0.1 ::1" : "127.0.0.1", "--dir", n.dir.path(),
                                     "--save", "", "--appendonly", "no", "--daemonize", "no",
                                     "--logfile", n.dir.Sub("redis.log"),
                                     // DEBUG SLEEP makes a node slow; from loopback only.
                                     "--enable-debug-command", "local"};
    if (cluster_) {
      argv.insert(argv.end(), {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                               "--cluster-node-timeout", std::to_string(node_timeout_.count()),
                               "--cluster-port", std::to_string(n.cluster_port),
                               "--cluster-require-full-coverage", "no",
                               "--cluster-replica-validity-factor", "0",
                               // A replica's first sync starts at once, not after 5 s.
                               "--repl-diskless-sync-delay", "0"});
    }
    std::string error;
    if (!n.child.Spawn(argv, n.dir.Sub("stdout"), n.dir.Sub("stderr"), &error)) {
      return Status::Internal("cannot start redis-server: " + error);
    }
    n.stopped = false;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < deadline && n.child.running()) {
      auto pong = Run(i, {"PING"}, milliseconds(500));
      if (pong.ok() && pong->str == "PONG") return Status::Ok();
      std::this_thread::sleep_for(milliseconds(10));
    }
    n.child.Kill();
    n.stopped = true;
    last_error = "redis-server on port " + std::to_string(n.port) +
                 " did not answer PING: " + Log(i) + ReadFileOrEmpty(n.dir.Sub("stderr"));
    // A cluster node restarted on its own port keeps it; a clash is fatal there.
    if (!n.id.empty()) break;
  }
  return Status::Internal(last_error);
}

Result<std::unique_ptr<RedisServers>> RedisServers::StartSingle(bool ipv6) {
  std::unique_ptr<RedisServers> s(new RedisServers(false));
  s->ipv6_ = ipv6;
  s->nodes_.push_back(std::make_unique<Node>());
  if (Status st = s->StartNode(0); !st.ok()) return st;
  return s;
}

Result<std::unique_ptr<RedisServers>> RedisServers::StartCluster(const ClusterOptions& options) {
  if (options.num_masters < 1 || options.num_masters > 16 || options.replicas_per_master < 0) {
    return Status::InvalidArgument("num_masters must be in 1..16, replicas_per_master >= 0");
  }
  std::unique_ptr<RedisServers> s(new RedisServers(true));
  s->node_timeout_ = options.node_timeout;
  const int masters = options.num_masters;
  const int total = masters * (1 + options.replicas_per_master);
  for (int i = 0; i < total; ++i) {
    s->nodes_.push_back(std::make_unique<Node>());
    if (i >= masters) s->nodes_.back()->replica_of = (i - masters) / options.replicas_per_master;
    if (Status st = s->StartNode(static_cast<size_t>(i)); !st.ok()) return st;
  }
  if (Status st = s->FormCluster(options); !st.ok()) return st;
  return s;
}

Status RedisServers::FormCluster(const ClusterOptions& options) {
  const auto deadline = Clock::now() + options.start_timeout;
  const int masters = options.num_masters;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    auto id = Run(i, {"CLUSTER", "MYID"});
    if (!id.ok() || id->type != RedisValue::Type::kString) return Failed("CLUSTER MYID", id);
    nodes_[i]->id = id->str;
    if (static_cast<int>(i) < masters) {
      const int first = static_cast<int>(i) * 16384 / masters;
      const int last = (static_cast<int>(i) + 1) * 16384 / masters - 1;
      auto r = Run(i, {"CLUSTER", "ADDSLOTSRANGE", std::to_string(first), std::to_string(last)});
      if (!IsOk(r)) return Failed("CLUSTER ADDSLOTSRANGE", r);
    }
    if (i > 0) {
      auto r = Run(0, {"CLUSTER", "MEET", "127.0.0.1", std::to_string(nodes_[i]->port),
                       std::to_string(nodes_[i]->cluster_port)});
      if (!IsOk(r)) return Failed("CLUSTER MEET", r);
    }
  }
  // A replica can follow its master only once it knows it (gossip).
  for (size_t i = static_cast<size_t>(masters); i < nodes_.size(); ++i) {
    const std::string& master_id = nodes_[static_cast<size_t>(nodes_[i]->replica_of)]->id;
    Result<RedisValue> r = Status::Internal("not tried");
    while (!IsOk(r = Run(i, {"CLUSTER", "REPLICATE", master_id}))) {
      if (Clock::now() > deadline) return Failed("CLUSTER REPLICATE", r);
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
  return WaitForClusterOk(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
}

Result<size_t> RedisServers::AnyRunning() const {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!nodes_[i]->stopped) return i;
  }
  return Status::Unavailable("no redis node is running");
}

Result<size_t> RedisServers::IndexOfPort(long long port) const {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->port == port) return i;
  }
  return Status::NotFound("no node on port " + std::to_string(port));
}

Status RedisServers::WaitForClusterOk(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string missing;
  do {
    missing.clear();
    std::set<std::string> slot_maps;
    for (size_t i = 0; i < nodes_.size() && missing.empty(); ++i) {
      if (nodes_[i]->stopped) continue;
      const std::string name = "node " + std::to_string(i) + ": ";
      auto info = Run(i, {"CLUSTER", "INFO"});
      auto repl = Run(i, {"INFO", "replication"});
      auto slots = Run(i, {"CLUSTER", "SLOTS"});
      if (!info.ok() || !repl.ok() || !slots.ok()) {
        missing = name + "does not answer";
      } else if (Field(*info, "cluster_state") != "ok") {
        missing = name + "cluster_state is not ok";
      } else if (Field(*repl, "role") == "slave" && Field(*repl, "master_link_status") != "up") {
        missing = name + "replica's master link is not up";
      } else {
        std::string map;  // "first-last@port ..." of the masters
        for (const RedisValue& e : slots->elements) {
          if (e.elements.size() < 3 || e.elements[2].elements.size() < 2) continue;
          map += std::to_string(e.elements[0].integer) + "-" +
                 std::to_string(e.elements[1].integer) + "@" +
                 std::to_string(e.elements[2].elements[1].integer) + " ";
        }
        slot_maps.insert(map);
      }
    }
    if (missing.empty() && slot_maps.size() > 1) missing = "nodes disagree on CLUSTER SLOTS";
    if (missing.empty()) return Status::Ok();
    std::this_thread::sleep_for(milliseconds(50));
  } while (Clock::now() < deadline);
  return Status::DeadlineExceeded("redis cluster not ok in " + std::to_string(timeout.count()) +
                                  " ms: " + missing);
}

Status RedisServers::WaitForReplicas(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::map<size_t, long long> master_offsets;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->stopped) continue;
    auto repl = Run(i, {"INFO", "replication"});
    if (!repl.ok()) return repl.status();
    if (Field(*repl, "role") == "master") {
      master_offsets[i] = std::atoll(Field(*repl, "master_repl_offset").c_str());
    }
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->stopped) continue;
    while (true) {
      auto repl = Run(i, {"INFO", "replication"});
      if (!repl.ok()) return repl.status();
      if (Field(*repl, "role") != "slave") break;
      auto master = IndexOfPort(std::atoll(Field(*repl, "master_port").c_str()));
      if (!master.ok() || !master_offsets.count(*master)) break;
      if (std::atoll(Field(*repl, "slave_repl_offset").c_str()) >= master_offsets[*master]) break;
      if (Clock::now() > deadline) {
        return Status::DeadlineExceeded("replica " + std::to_string(i) + " is behind its master");
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  return Status::Ok();
}

Result<size_t> RedisServers::WaitForFailover(size_t dead_master, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i]->stopped || nodes_[i]->replica_of != static_cast<int>(dead_master)) continue;
      auto repl = Run(i, {"INFO", "replication"});
      if (!repl.ok() || Field(*repl, "role") != "master") continue;
      nodes_[i]->replica_of = -1;
      Status ok =
          WaitForClusterOk(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
      if (!ok.ok()) return ok;
      return i;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  return Status::DeadlineExceeded("no replica of node " + std::to_string(dead_master) +
                                  " became a master in " + std::to_string(timeout.count()) + " ms");
}

void RedisServers::Kill(size_t i) {
  Node& n = *nodes_.at(i);
  if (!n.stopped) n.child.Kill();
  n.stopped = true;
}

void RedisServers::StopAll() {
  for (size_t i = 0; i < nodes_.size(); ++i) Kill(i);
}

Status RedisServers::RestartStopped(milliseconds timeout) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!nodes_[i]->stopped) continue;
    if (Status s = StartNode(i); !s.ok()) return s;
  }
  return cluster_ ? WaitForClusterOk(timeout) : Status::Ok();
}

Result<uint16_t> RedisServers::KeySlot(const std::string& key) const {
  auto any = AnyRunning();
  if (!any.ok()) return any.status();
  auto r = Run(*any, {"CLUSTER", "KEYSLOT", key});
  if (!r.ok() || r->type != RedisValue::Type::kInteger) return Failed("CLUSTER KEYSLOT", r);
  return static_cast<uint16_t>(r->integer);
}

Result<size_t> RedisServers::MasterOfSlot(uint16_t slot) const {
  auto any = AnyRunning();
  if (!any.ok()) return any.status();
  auto r = Run(*any, {"CLUSTER", "SLOTS"});
  if (!r.ok()) return r.status();
  for (const RedisValue& e : r->elements) {
    if (e.elements.size() >= 3 && e.elements[0].integer <= slot && slot <= e.elements[1].integer &&
        e.elements[2].elements.size() >= 2) {
      return IndexOfPort(e.elements[2].elements[1].integer);
    }
  }
  return Status::NotFound("no master serves slot " + std::to_string(slot));
}

Status RedisServers::BeginSlotMigration(uint16_t slot, size_t from, size_t to) {
  const std::string s = std::to_string(slot);
  auto r = Run(to, {"CLUSTER", "SETSLOT", s, "IMPORTING", node_id(from)});
  if (!IsOk(r)) return Failed("SETSLOT IMPORTING", r);
  r = Run(from, {"CLUSTER", "SETSLOT", s, "MIGRATING", node_id(to)});
  if (!IsOk(r)) return Failed("SETSLOT MIGRATING", r);
  while (true) {
    auto keys = Run(from, {"CLUSTER", "GETKEYSINSLOT", s, "100"});
    if (!keys.ok() || keys->type != RedisValue::Type::kArray) return Failed("GETKEYSINSLOT", keys);
    if (keys->elements.empty()) return Status::Ok();
    std::vector<std::string> migrate = {"MIGRATE", "127.0.0.1", std::to_string(port(to)), "", "0",
                                        "5000",    "KEYS"};
    for (const RedisValue& k : keys->elements) migrate.push_back(k.str);
    r = Run(from, migrate, std::chrono::seconds(10));
    if (!IsOk(r)) return Failed("MIGRATE", r);
  }
}

Status RedisServers::FinishSlotMigration(uint16_t slot, size_t from, size_t to) {
  std::vector<size_t> order = {to, from};
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (i != to && i != from && !nodes_[i]->stopped && nodes_[i]->replica_of < 0) {
      order.push_back(i);
    }
  }
  for (size_t i : order) {
    auto r = Run(i, {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", node_id(to)});
    if (!IsOk(r)) return Failed("SETSLOT NODE on node " + std::to_string(i), r);
  }
  return Status::Ok();
}

}  // namespace kvtier::testing
