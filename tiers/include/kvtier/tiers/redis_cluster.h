// RedisCluster: a client of a Redis Cluster, or of one Redis/Valkey server,
// over hiredis: the remote tier's transport (remote_tier.h). It moves opaque
// byte values under opaque keys; what they mean is the remote tier's.
//
// Cluster mode: the slot map comes from CLUSTER SLOTS on any reachable node
// (the known masters first, then the seeds and the other nodes seen); it is
// asked again after a MOVED, a connection failure or a CLUSTERDOWN answer, at
// most once per topology_refresh (a MOVED also moves its one slot in the map
// at once). A key's slot is CRC16(key or its {hash tag}) mod 16384. A MOVED
// answer updates the map and retries at the new owner; an ASK answer retries
// once at the node named, after ASKING; at most max_redirects of either per
// key. Single-server mode: a seed whose CLUSTER SLOTS answers "cluster support
// disabled" (or that does not know the CLUSTER command) serves every key.
//
// Failures never throw and never block past the timeouts: a node down, slow
// (io_timeout) or answering an error gives that key's call UNAVAILABLE with
// the node and cause in the message; the connection is dropped and made again
// by a later call (no more often than reconnect_backoff per node). A pooled
// connection that fails before its first answer (the server closed it while it
// was idle) is replaced at once and the node's batch sent once more (GET, SET,
// EXISTS and DEL are idempotent). A call takes at most its refresh (nodes asked
// one after another, each within connect_timeout + io_timeout) plus, for each
// node it reaches in each redirect round, connect_timeout + io_timeout. Nothing
// fails at Create for an unreachable cluster: it is found when it comes up.
// A write to a connection the server reset raises no SIGPIPE (it is blocked
// in the calling thread around hiredis's writes, and discarded).
//
// Thread-safety: thread-safe. Each call borrows a connection per node from
// that node's pool (pool_size connections), so calls from several threads run
// in parallel; a call needing a node whose connections are all lent waits for one.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

struct RedisEndpoint {
  std::string host;  // a name, an IPv4 address or an IPv6 address (no brackets)
  uint16_t port = 6379;

  std::string ToString() const;  // "host:port", "[v6]:port"
};

// "redis://host:port[,host:port...]": the seeds, in order. A port defaults to
// 6379; an IPv6 address is written in brackets. Errors: INVALID_ARGUMENT
// naming what is wrong (scheme, empty host, port not in 1..65535, a user or
// password, which are not supported, a path).
Result<std::vector<RedisEndpoint>> ParseRedisUrl(std::string_view url);

struct RedisClusterOptions {
  std::vector<RedisEndpoint> seeds;  // at least one
  // Connections kept per node. Range 1..256. Default: 4.
  uint32_t pool_size = 4;
  // TCP connect timeout (resolving a host name is not bounded by it). Default: 50 ms.
  std::chrono::milliseconds connect_timeout{50};
  // Longest wait for one node's answers to a pipelined batch, plus the time the
  // batch's bytes (sent, and the values a GET may get) take at kMinBytesPerSecond:
  // a node slower than that, however it paces its bytes, fails the batch.
  // Default: 100 ms.
  std::chrono::milliseconds io_timeout{100};
  static constexpr uint64_t kMinBytesPerSecond = uint64_t{64} << 20;
  // Least time between two connection attempts to a node that failed. Default: 200 ms.
  std::chrono::milliseconds reconnect_backoff{200};
  // Least time between two CLUSTER SLOTS refreshes. Default: 1 s.
  std::chrono::milliseconds topology_refresh{1000};
  // MOVED and ASK redirects followed per key. Range 1..16. Default: 5.
  uint32_t max_redirects = 5;

  Status Validate() const;  // INVALID_ARGUMENT naming the field
};

class RedisCluster {
 public:
  // Checks the options; connects to nothing yet.
  static Result<std::unique_ptr<RedisCluster>> Create(const RedisClusterOptions& options);
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  // One GET: `dst` receives the value. result: OK (bytes = its size), NOT_FOUND
  // (no such key), DATA_LOSS (the value is longer than dst: bytes = its size,
  // nothing written to dst; or the key holds another type: WRONGTYPE),
  // UNAVAILABLE (node down, timeout, too many redirects, another error answer,
  // or an answer of the wrong type).
  struct Get {
    std::string_view key;
    std::span<std::byte> dst;
    size_t bytes = 0;
    Status result;
  };
  // Pipelined: one batch per node; keys of a node are sent together, and
  // nodes are asked one after another. Every entry's result is set.
  void GetMany(std::span<Get> gets);

  // One SET (`expire_seconds` 0: no TTL). result: OK, RESOURCE_EXHAUSTED (an
  // OOM answer: a full server under maxmemory noeviction, still up), or UNAVAILABLE.
  struct Set {
    std::string_view key;
    std::span<const std::byte> value;
    Status result;
  };
  void SetMany(std::span<Set> sets, uint32_t expire_seconds = 0);

  // EXISTS per key. result: OK (found says whether it is there) or UNAVAILABLE.
  struct Exists {
    std::string_view key;
    bool found = false;
    Status result;
  };
  void ExistsMany(std::span<Exists> keys);

  // DEL per key. result: OK (whether or not it was there) or UNAVAILABLE.
  struct Del {
    std::string_view key;
    Status result;
  };
  void DelMany(std::span<Del> keys);

  // Whether the last topology probe found a cluster (false: single server, or
  // nothing reached yet).
  bool cluster_mode() const;
  // Nodes that own slots in the current map (one in single-server mode).
  std::vector<RedisEndpoint> Masters() const;

  struct Counters {
    uint64_t moved = 0;               // MOVED redirects followed
    uint64_t ask = 0;                 // ASK redirects followed
    uint64_t topology_refreshes = 0;  // CLUSTER SLOTS answers taken
    uint64_t connects = 0;            // connections made
    uint64_t connect_failures = 0;
    uint64_t timeouts = 0;  // batches past io_timeout
    uint64_t errors = 0;    // keys answered UNAVAILABLE, timeouts included
  };
  Counters counters() const;

  // CRC16 (XMODEM) of the key, or of its hash tag, mod 16384: the cluster's slot.
  static uint16_t KeySlot(std::string_view key);

 private:
  class Impl;
  explicit RedisCluster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
