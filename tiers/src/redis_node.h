// RedisNode: one Redis server's pool of hiredis connections, private to
// RedisCluster (redis_cluster.cc). Also the reply helpers both use.
//
// A connection is lent as a RedisConnection (RAII): it goes back to the pool
// when destroyed, or is closed when it broke (an I/O error, a timeout, a
// protocol error), since a broken connection may still hold unread answers.
//
// Thread-safety: RedisNode is thread-safe. A RedisConnection belongs to the
// thread that borrowed it. Every RedisConnection must be destroyed before its
// RedisNode.
#pragma once

#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/tiers/redis_cluster.h"

namespace kvtier::redis {

using Clock = std::chrono::steady_clock;

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

// RedisCluster::Counters, shared by the cluster and its nodes.
struct AtomicCounters {
  std::atomic<uint64_t> moved{0};
  std::atomic<uint64_t> ask{0};
  std::atomic<uint64_t> topology_refreshes{0};
  std::atomic<uint64_t> connects{0};
  std::atomic<uint64_t> connect_failures{0};
  std::atomic<uint64_t> timeouts{0};
  std::atomic<uint64_t> errors{0};
};

// "string 'abc'", "integer 3", "array of 2", "nil", "error 'ERR x'": for
// messages; content cut at 64 bytes, bytes outside printable ASCII escaped.
std::string DescribeReply(const redisReply& reply);

class RedisNode;

class RedisConnection {
 public:
  RedisConnection() = default;
  RedisConnection(RedisNode* node, redisContext* ctx, bool reused)
      : node_(node), ctx_(ctx), reused_(reused) {}
  RedisConnection(RedisConnection&& other) noexcept;
  RedisConnection& operator=(RedisConnection&& other) noexcept;
  ~RedisConnection();  // back to the pool, or closed when broken

  // Queues one command (binary-safe arguments); sent by the next ReadReply.
  // An argument of 4 KiB or more is not copied: it is sent from `argv[i]`,
  // which must stay valid and unchanged until the answers are read (or this
  // connection is destroyed). REQUIRES: argc >= 1.
  void Append(int argc, const char* const* argv, const size_t* argv_len);
  // Sends what is queued and reads the next answer, waiting until `deadline`
  // at most, however the server paces its bytes (the socket is polled; no
  // system call blocks). An answer over `bound` is not read on (a server could
  // stream gigabytes into it, or announce an array of billions). Error answers
  // (REDIS_REPLY_ERROR) are OK here, in *reply. Errors: UNAVAILABLE naming the
  // node and the cause ("no answer within io_timeout" sets *timed_out); the
  // connection is then broken. Raises no SIGPIPE.
  // The answer being read: array elements it may still hold, and the length
  // of an array refused for holding more.
  struct ElementBudget {
    size_t left = 0;
    size_t refused = 0;
  };
  // What one answer may hold at most: bytes on the wire, and array elements
  // (hiredis allocates an array's pointers when its length arrives).
  struct Bound {
    size_t bytes;
    size_t elements;
  };
  // An answer to a command other than GET (CLUSTER SLOTS of a large cluster
  // is the longest).
  static constexpr Bound kControlReply{size_t{1} << 20, size_t{1} << 16};
  // A GET's answer into a buffer of `dst_bytes`: a string (a value somewhat
  // larger is read, and refused as not fitting), never an array.
  static constexpr Bound GetReply(size_t dst_bytes) { return {dst_bytes + (size_t{1} << 20), 0}; }
  Status ReadReply(Clock::time_point deadline, Reply* reply, bool* timed_out,
                   Bound bound = kControlReply);
  // Whether it was idle in the pool before (the server may have closed it meanwhile);
  // false for a connection made by this Borrow.
  bool reused() const { return reused_; }

 private:
  RedisNode* node_ = nullptr;
  redisContext* ctx_ = nullptr;
  bool reused_ = false;
  // Back to the pool, or closed when broken or mid-command.
  void GiveBack();
  // Sends what the socket takes of the queue (non-blocking): 1 when it took
  // some, 0 when it took none, -1 on an I/O error (*error says which).
  int WriteSome(std::string* error);

  bool broken_ = false;
  // What Append queued, in order: framing_'s bytes at [offset, offset + len)
  // when ptr is null, else the caller's bytes at ptr.
  struct Segment {
    const char* ptr;
    size_t offset;
    size_t len;
  };
  std::vector<Segment> out_;
  std::string framing_;
  size_t out_next_ = 0;   // the first segment not wholly sent
  size_t out_sent_ = 0;   // its bytes sent
  ElementBudget budget_;  // of the answer being read (the reader's privdata)
};

struct RedisNodeOptions {
  uint32_t pool_size = 4;
  std::chrono::milliseconds connect_timeout{50};
  std::chrono::milliseconds io_timeout{100};
  std::chrono::milliseconds reconnect_backoff{200};
};

class RedisNode {
 public:
  // `counters` must outlive the node.
  RedisNode(RedisEndpoint endpoint, const RedisNodeOptions& options, AtomicCounters* counters);
  ~RedisNode();  // closes the idle connections; REQUIRES: none lent
  RedisNode(const RedisNode&) = delete;
  RedisNode& operator=(const RedisNode&) = delete;

  const RedisEndpoint& endpoint() const { return endpoint_; }
  const std::string& name() const { return name_; }  // endpoint().ToString()
  const RedisNodeOptions& options() const { return options_; }

  // Lends an idle connection, or connects a new one (connect_timeout) when
  // fewer than pool_size are open; waits while all are lent, until `deadline`
  // at most. Errors: UNAVAILABLE when none was free by then, when connecting
  // fails, or when it failed less than reconnect_backoff ago (then nothing is
  // tried).
  Result<RedisConnection> Borrow(Clock::time_point deadline);
  // Closes the idle connections: after one broke, the others most likely
  // lead to a dead or restarted server too.
  void DropIdle();

 private:
  friend class RedisConnection;
  // Takes a lent connection back (closes it when `broken`).
  void Return(redisContext* ctx, bool broken);
  Result<RedisConnection> Connect();

  const RedisEndpoint endpoint_;
  const std::string name_;
  const RedisNodeOptions options_;
  AtomicCounters* const counters_;

  std::mutex mu_;
  std::condition_variable returned_;
  std::vector<redisContext*> idle_;  // REQUIRES: mu_ held
  uint32_t num_open_ = 0;            // idle, lent and connecting; REQUIRES: mu_ held
  bool failed_ = false;              // the last connect failed; REQUIRES: mu_ held
  Clock::time_point failed_at_;      // REQUIRES: mu_ held
  std::string last_error_;           // REQUIRES: mu_ held
};

}  // namespace kvtier::redis
