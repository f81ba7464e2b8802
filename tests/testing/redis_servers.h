// RedisServers: real redis-server processes for tests (never linked into
// production targets): one plain server, or a Redis Cluster of masters with
// replicas, on free loopback ports, each node in its own temporary directory
// with persistence off (--save '' --appendonly no) and DEBUG allowed from
// loopback (DEBUG SLEEP <seconds> makes a node slow).
//
//   auto servers = RedisServers::StartCluster({});   // 3 masters, 1 replica each
//   ASSERT_TRUE(servers.ok()) << servers.status().ToString();
//   RedisClusterOptions o;  o.seeds = (*servers)->Seeds();
//
// Ports: each node's client port and cluster bus port are found by binding
// port 0 on 127.0.0.1 (never 9400); a node that cannot start on them (another
// process took the port meanwhile) is started again on new ones.
//
// Cluster: slots are split evenly over the masters (CLUSTER ADDSLOTSRANGE),
// the nodes meet (CLUSTER MEET), replicas follow their masters (CLUSTER
// REPLICATE); StartCluster returns once WaitForClusterOk() passes. The nodes
// run with cluster-require-full-coverage no (a dead master's slots fail, the
// others keep serving) and cluster-replica-validity-factor 0 (a replica always
// takes over its dead master).
//
// Every process is killed (SIGKILL) and reaped by the destructor, so none
// outlives a failed test, and dies with the test process itself
// (PR_SET_PDEATHSIG; tests/testing/daemon_process.h).
//
// Build: link the CMake target kvtier_testing_redis (it includes
// daemon_process.cc: do not list that file in the same test's sources).
//
// Thread-safety: not thread-safe; use from the test's thread. Run() alone may
// be called from several threads at once (each call opens its own connection).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/tiers/redis_cluster.h"

namespace kvtier::testing {

// A Redis answer, copied out of hiredis's reply.
struct RedisValue {
  enum class Type { kNil, kString, kStatus, kError, kInteger, kArray };
  Type type = Type::kNil;
  std::string str;                   // kString, kStatus, kError
  long long integer = 0;             // kInteger
  std::vector<RedisValue> elements;  // kArray
  std::string ToString() const;      // for failure messages
};

class RedisServers {
 public:
  struct ClusterOptions {
    // Masters; slots are split evenly. Range 1..16. Default: 3.
    int num_masters = 3;
    // Replicas per master. Default: 1.
    int replicas_per_master = 1;
    // cluster-node-timeout: how soon a dead master is failed over. Default: 1000 ms.
    std::chrono::milliseconds node_timeout{1000};
    // Longest wait for the cluster to form. Default: 30 s.
    std::chrono::milliseconds start_timeout{30000};
  };

  // One plain server (cluster support disabled), PING-ready. With `ipv6` it
  // also listens on ::1 (fails where the host has no IPv6 loopback).
  static Result<std::unique_ptr<RedisServers>> StartSingle(bool ipv6 = false);
  // A cluster, formed and healthy (WaitForClusterOk). Node indexes: masters
  // 0..num_masters-1, then the replicas, master m's r-th replica at
  // num_masters + m * replicas_per_master + r.
  static Result<std::unique_ptr<RedisServers>> StartCluster(const ClusterOptions& options);

  ~RedisServers();  // SIGKILL and reap every node; remove the directories
  RedisServers(const RedisServers&) = delete;
  RedisServers& operator=(const RedisServers&) = delete;

  size_t size() const { return nodes_.size(); }
  bool cluster() const { return cluster_; }
  uint16_t port(size_t i) const;
  RedisEndpoint endpoint(size_t i) const { return {"127.0.0.1", port(i)}; }
  // Every node's endpoint, in index order (seeds for RedisCluster).
  std::vector<RedisEndpoint> Seeds() const;
  // "redis://127.0.0.1:<port>,..." of every node.
  std::string Url() const;
  // Node i's cluster node id ("" for a plain server).
  const std::string& node_id(size_t i) const;
  // Index of the master node i replicates at start, or -1 for a master.
  int replica_of(size_t i) const;
  bool running(size_t i);
  // The node's redis-server log, for failure messages.
  std::string Log(size_t i) const;

  // Runs one command on node i over a fresh connection (binary-safe
  // arguments). An error answer is an OK result of type kError. Errors:
  // UNAVAILABLE when the node cannot be reached or answers nothing in `timeout`.
  Result<RedisValue> Run(size_t i, const std::vector<std::string>& argv,
                         std::chrono::milliseconds timeout = std::chrono::seconds(2)) const;

  // SIGKILL node i and reap it. Its port and directory are kept.
  void Kill(size_t i);
  // SIGKILL every node.
  void StopAll();
  // Starts every stopped node again on its own port and directory (a
  // cluster node keeps its nodes.conf, so the same cluster comes back; the
  // data is gone), then waits until healthy (WaitForClusterOk, or PING).
  Status RestartStopped(std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // Waits until every running node says cluster_state:ok, every running
  // replica's link to its master is up, and all running nodes give the same
  // CLUSTER SLOTS masters. Errors: DEADLINE_EXCEEDED saying what was last
  // seen missing.
  Status WaitForClusterOk(std::chrono::milliseconds timeout);
  // Waits until every running replica has the replication offset its master
  // had when called: what was written before is on the replicas.
  Status WaitForReplicas(std::chrono::milliseconds timeout);
  // Waits until a replica of `dead_master` (killed before) is a master and
  // the cluster is ok again. Returns the new master's index.
  Result<size_t> WaitForFailover(size_t dead_master, std::chrono::milliseconds timeout);

  // The slot of `key` by CLUSTER KEYSLOT on a running node.
  Result<uint16_t> KeySlot(const std::string& key) const;
  // Index of the node serving `slot`, by CLUSTER SLOTS on a running node.
  Result<size_t> MasterOfSlot(uint16_t slot) const;
  // Starts moving `slot` from node `from` to node `to`: SETSLOT IMPORTING on
  // `to`, MIGRATING on `from`, and MIGRATE of every key in it. Afterwards
  // `from` answers ASK for the slot's keys.
  Status BeginSlotMigration(uint16_t slot, size_t from, size_t to);
  // Ends it: CLUSTER SETSLOT <slot> NODE <to> on `to`, `from` and every other
  // running master. Afterwards the old owner answers MOVED.
  Status FinishSlotMigration(uint16_t slot, size_t from, size_t to);

 private:
  struct Node;
  explicit RedisServers(bool cluster);
  Status StartNode(size_t i);
  Status FormCluster(const ClusterOptions& options);
  // Index of the node on `port`, if any.
  Result<size_t> IndexOfPort(long long port) const;
  // A running node to ask.
  Result<size_t> AnyRunning() const;

  bool cluster_;
  bool ipv6_ = false;
  std::chrono::milliseconds node_timeout_{1000};
  std::vector<std::unique_ptr<Node>> nodes_;
};

}  // namespace kvtier::testing
