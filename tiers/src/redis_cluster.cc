#include "kvtier/tiers/redis_cluster.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <utility>

#include "redis_node.h"
#include "redis_protocol.h"

namespace kvtier {

using redis::Clock;
using redis::RedisNode;
using redis::Reply;

namespace {

// One key's command: argv[0..argc) with their lengths; the views must outlive the call.
struct Command {
  std::string_view key;
  std::array<const char*, 5> argv{};
  std::array<size_t, 5> len{};
  int argc = 0;
  // Its answer's bound (RedisConnection::ReadReply), and the bytes it is expected to bring
  // (a GET: its buffer), for the batch's deadline.
  redis::RedisConnection::Bound bound = redis::RedisConnection::kControlReply;
  uint64_t reply_bytes = 0;
};

Command MakeCommand(std::string_view key, std::initializer_list<std::string_view> args) {
  Command c;
  c.key = key;
  for (std::string_view a : args) {
    c.argv[c.argc] = a.data();
    c.len[c.argc] = a.size();
    ++c.argc;
  }
  return c;
}

// Turns command i's answer (never an error answer) from `node` into its result.
using ReplyHandler =
    std::function<Status(size_t i, const redisReply& reply, const std::string& node)>;

constexpr uint16_t kNoOwner = 0xffff;
constexpr size_t kMaxNodes = 1024;  // bounds what a hostile MOVED stream can make us keep

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

// Lock order: refresh_mu_, then mu_. A RedisNode's own lock is never held
// while either is taken.
class RedisCluster::Impl {
 public:
  explicit Impl(const RedisClusterOptions& options)
      : options_(options),
        node_options_{options.pool_size, options.connect_timeout, options.io_timeout,
                      options.reconnect_backoff},
        owner_(redis::kNumSlots, kNoOwner) {}

  // Runs every command at its key's master (pipelined per node) and returns
  // each command's result.
  std::vector<Status> Run(std::span<const Command> cmds, const ReplyHandler& on_reply);

  bool cluster_mode() const { return cluster_mode_.load(std::memory_order_relaxed); }
  std::vector<RedisEndpoint> Masters() const;
  Counters counters() const;

 private:
  // A command still to send: to its slot's master, or to `at` (after a redirect).
  struct Pending {
    size_t cmd = 0;
    uint32_t redirects = 0;
    std::shared_ptr<RedisNode> at;
    bool asking = false;  // send ASKING first
  };
  struct Group {
    std::shared_ptr<RedisNode> node;
    std::vector<Pending> items;
  };
  struct Topology {
    bool cluster = false;
    std::vector<redis::SlotRange> ranges;
  };

  void RefreshIfStale();
  Result<Topology> Probe(RedisNode& node);
  void Install(const RedisNode& node, const Topology& topology);
  std::vector<Group> Route(std::span<Pending> pending, std::span<const Command> cmds,
                           std::vector<Status>& results);
  // Sends the group's commands to its node and takes their answers; on a failure the
  // unanswered ones get it.
  void RunOnNode(Group& group, std::span<const Command> cmds, const ReplyHandler& on_reply,
                 std::vector<Status>& results, std::vector<Pending>& next);
  // One attempt of RunOnNode on `conn`: *answered counts the commands answered before an
  // error (returned; *timed_out says whether it was io_timeout).
  Status Exchange(redis::RedisConnection& conn, const Group& group, std::span<const Command> cmds,
                  Clock::time_point deadline, const ReplyHandler& on_reply,
                  std::vector<Status>& results, std::vector<Pending>& next, size_t* answered,
                  bool* timed_out);
  void OnError(RedisNode& node, const Pending& p, const redisReply& reply,
               std::vector<Status>& results, std::vector<Pending>& next);
  void MarkStale() {
    std::lock_guard lock(mu_);
    stale_ = true;
  }
  // nodes_'s index of `ep` (added when new), or kNoOwner past kMaxNodes.
  // REQUIRES: mu_ held
  uint16_t IndexLocked(const RedisEndpoint& ep);
  // Indexes of the nodes owning slots, in slot order. REQUIRES: mu_ held
  std::vector<uint16_t> MastersLocked() const;

  const RedisClusterOptions options_;
  const redis::RedisNodeOptions node_options_;
  redis::AtomicCounters counters_;  // before nodes_: nodes point to it
  std::atomic<bool> cluster_mode_{false};

  std::mutex refresh_mu_;  // one topology refresh at a time
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<RedisNode>> nodes_;  // every node seen; REQUIRES: mu_ held
  std::vector<uint16_t> owner_;     // slot -> nodes_ index or kNoOwner; REQUIRES: mu_ held
  bool have_map_ = false;           // REQUIRES: mu_ held
  bool stale_ = true;               // REQUIRES: mu_ held
  Clock::time_point last_refresh_;  // last attempt; REQUIRES: mu_ held
  std::string refresh_error_;       // why the last attempt failed; REQUIRES: mu_ held
};

uint16_t RedisCluster::Impl::IndexLocked(const RedisEndpoint& ep) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const RedisEndpoint& n = nodes_[i]->endpoint();
    if (n.host == ep.host && n.port == ep.port) return static_cast<uint16_t>(i);
  }
  if (nodes_.size() >= kMaxNodes) return kNoOwner;
  nodes_.push_back(std::make_shared<RedisNode>(ep, node_options_, &counters_));
  return static_cast<uint16_t>(nodes_.size() - 1);
}

std::vector<uint16_t> RedisCluster::Impl::MastersLocked() const {
  std::vector<uint16_t> masters;
  for (const uint16_t o : owner_) {
    if (o != kNoOwner && std::find(masters.begin(), masters.end(), o) == masters.end()) {
      masters.push_back(o);
    }
  }
  return masters;
}

std::vector<RedisEndpoint> RedisCluster::Impl::Masters() const {
  std::lock_guard lock(mu_);
  std::vector<RedisEndpoint> out;
  for (const uint16_t i : MastersLocked()) out.push_back(nodes_[i]->endpoint());
  return out;
}

RedisCluster::Counters RedisCluster::Impl::counters() const {
  constexpr auto r = std::memory_order_relaxed;
  return Counters{counters_.moved.load(r),
                  counters_.ask.load(r),
                  counters_.topology_refreshes.load(r),
                  counters_.connects.load(r),
                  counters_.connect_failures.load(r),
                  counters_.timeouts.load(r),
                  counters_.errors.load(r)};
}

void RedisCluster::Impl::RefreshIfStale() {
  {
    std::lock_guard lock(mu_);
    if (!stale_) return;
    if (have_map_ && Clock::now() - last_refresh_ < options_.topology_refresh) return;
  }
  std::unique_lock refresh(refresh_mu_, std::try_to_lock);
  if (!refresh.owns_lock()) {
    {
      std::lock_guard lock(mu_);
      if (have_map_) return;  // use the map in hand while another thread refreshes it
    }
    refresh.lock();
    std::lock_guard lock(mu_);
    if (!stale_) return;
  }
  std::vector<std::shared_ptr<RedisNode>> candidates;
  {
    std::lock_guard lock(mu_);
    for (const uint16_t i : MastersLocked()) candidates.push_back(nodes_[i]);
    for (const RedisEndpoint& seed : options_.seeds) {
      if (const uint16_t i = IndexLocked(seed); i != kNoOwner) candidates.push_back(nodes_[i]);
    }
    for (const auto& n : nodes_) candidates.push_back(n);
  }
  std::string errors;
  for (size_t i = 0; i < candidates.size(); ++i) {
    RedisNode& node = *candidates[i];
    if (std::find(candidates.begin(), candidates.begin() + i, candidates[i]) !=
        candidates.begin() + i) {
      continue;  // asked already
    }
    auto topology = Probe(node);
    if (topology.ok()) {
      Install(node, *topology);
      return;
    }
    errors += (errors.empty() ? "" : "; ") + topology.status().message();
  }
  std::lock_guard lock(mu_);
  last_refresh_ = Clock::now();
  refresh_error_ = errors;
}

Result<RedisCluster::Impl::Topology> RedisCluster::Impl::Probe(RedisNode& node) {
  const auto deadline = Clock::now() + options_.io_timeout;
  auto conn = node.Borrow(deadline);
  if (!conn.ok()) return conn.status();
  static const char* kArgv[] = {"CLUSTER", "SLOTS"};
  static const size_t kLen[] = {7, 5};
  conn->Append(2, kArgv, kLen);
  Reply reply;
  bool timed_out = false;
  Status s = conn->ReadReply(deadline, &reply, &timed_out);
  if (!s.ok()) {
    if (timed_out) counters_.timeouts.fetch_add(1, std::memory_order_relaxed);
    node.DropIdle();
    return s;
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    const std::string_view e(reply->str != nullptr ? reply->str : "", reply->len);
    if (redis::IsClusterDisabled(e)) return Topology{};
    return Status::Unavailable(node.name() + ": CLUSTER SLOTS answered " +
                               redis::DescribeReply(*reply));
  }
  auto ranges = redis::ParseClusterSlots(*reply, node.endpoint());
  if (!ranges.ok()) return Status::Unavailable(node.name() + ": " + ranges.status().message());
  return Topology{true, std::move(ranges).value()};
}

void RedisCluster::Impl::Install(const RedisNode& node, const Topology& topology) {
  std::lock_guard lock(mu_);
  std::fill(owner_.begin(), owner_.end(), kNoOwner);
  if (!topology.cluster) {
    std::fill(owner_.begin(), owner_.end(), IndexLocked(node.endpoint()));
  }
  for (const redis::SlotRange& r : topology.ranges) {
    const uint16_t i = IndexLocked(r.master);
    std::fill(owner_.begin() + r.first, owner_.begin() + r.last + 1, i);
  }
  cluster_mode_.store(topology.cluster, std::memory_order_relaxed);
  have_map_ = true;
  stale_ = false;
  last_refresh_ = Clock::now();
  refresh_error_.clear();
  counters_.topology_refreshes.fetch_add(1, std::memory_order_relaxed);
}

std::vector<RedisCluster::Impl::Group> RedisCluster::Impl::Route(std::span<Pending> pending,
                                                                 std::span<const Command> cmds,
                                                                 std::vector<Status>& results) {
  std::vector<Group> groups;
  std::lock_guard lock(mu_);
  for (Pending& p : pending) {
    std::shared_ptr<RedisNode> node = p.at;
    if (node == nullptr) {
      const uint16_t slot = KeySlot(cmds[p.cmd].key);
      if (owner_[slot] == kNoOwner) {
        results[p.cmd] = Status::Unavailable(
            have_map_ ? "slot " + std::to_string(slot) + " has no master in the cluster's map"
                      : "no node answered CLUSTER SLOTS: " + refresh_error_);
        continue;
      }
      node = nodes_[owner_[slot]];
    }
    auto g =
        std::find_if(groups.begin(), groups.end(), [&](const Group& x) { return x.node == node; });
    if (g == groups.end()) g = groups.insert(groups.end(), Group{node, {}});
    g->items.push_back(std::move(p));
  }
  return groups;
}

std::vector<Status> RedisCluster::Impl::Run(std::span<const Command> cmds,
                                            const ReplyHandler& on_reply) {
  std::vector<Status> results(cmds.size());
  std::vector<Pending> pending(cmds.size());
  for (size_t i = 0; i < cmds.size(); ++i) pending[i].cmd = i;
  RefreshIfStale();
  while (!pending.empty()) {
    std::vector<Pending> next;
    for (Group& g : Route(pending, cmds, results)) RunOnNode(g, cmds, on_reply, results, next);
    pending.swap(next);
  }
  const auto failed = std::count_if(results.begin(), results.end(), [](const Status& s) {
    return s.code() == StatusCode::kUnavailable;
  });
  counters_.errors.fetch_add(static_cast<uint64_t>(failed), std::memory_order_relaxed);
  return results;
}

void RedisCluster::Impl::RunOnNode(Group& group, std::span<const Command> cmds,
                                   const ReplyHandler& on_reply, std::vector<Status>& results,
                                   std::vector<Pending>& next) {
  RedisNode& node = *group.node;
  uint64_t bytes = 0;  // what the batch moves at most
  for (const Pending& p : group.items) {
    const Command& c = cmds[p.cmd];
    for (int a = 0; a < c.argc; ++a) bytes += c.len[a];
    bytes += c.reply_bytes;
  }
  const auto deadline =
      Clock::now() + options_.io_timeout +
      std::chrono::microseconds(bytes * 1'000'000 / RedisClusterOptions::kMinBytesPerSecond);
  for (int attempt = 0;; ++attempt) {
    auto conn = node.Borrow(deadline);
    if (!conn.ok()) {
      for (const Pending& p : group.items) results[p.cmd] = conn.status();
      MarkStale();
      return;
    }
    size_t answered = 0;
    bool timed_out = false;
    const Status s =
        Exchange(*conn, group, cmds, deadline, on_reply, results, next, &answered, &timed_out);
    if (s.ok()) return;
    node.DropIdle();
    // A pooled connection the server closed while it was idle fails before any answer:
    // the batch goes once more, on a new connection (every command here is idempotent).
    if (attempt == 0 && conn->reused() && answered == 0 && !timed_out) continue;
    if (timed_out) counters_.timeouts.fetch_add(1, std::memory_order_relaxed);
    for (size_t j = answered; j < group.items.size(); ++j) results[group.items[j].cmd] = s;
    MarkStale();
    return;
  }
}

Status RedisCluster::Impl::Exchange(redis::RedisConnection& conn, const Group& group,
                                    std::span<const Command> cmds, Clock::time_point deadline,
                                    const ReplyHandler& on_reply, std::vector<Status>& results,
                                    std::vector<Pending>& next, size_t* answered, bool* timed_out) {
  static const char* kAsking[] = {"ASKING"};
  static const size_t kAskingLen[] = {6};
  for (const Pending& p : group.items) {
    if (p.asking) conn.Append(1, kAsking, kAskingLen);
    const Command& c = cmds[p.cmd];
    conn.Append(c.argc, c.argv.data(), c.len.data());
  }
  for (const Pending& p : group.items) {
    Reply reply;
    // ASKING's own answer came first; the command's answer says whether it worked.
    Status s = p.asking ? conn.ReadReply(deadline, &reply, timed_out) : Status::Ok();
    if (s.ok()) s = conn.ReadReply(deadline, &reply, timed_out, cmds[p.cmd].bound);
    if (!s.ok()) return s;
    if (reply->type == REDIS_REPLY_ERROR) {
      OnError(*group.node, p, *reply, results, next);
    } else {
      results[p.cmd] = on_reply(p.cmd, *reply, group.node->name());
    }
    ++*answered;
  }
  return Status::Ok();
}

void RedisCluster::Impl::OnError(RedisNode& node, const Pending& p, const redisReply& reply,
                                 std::vector<Status>& results, std::vector<Pending>& next) {
  const std::string_view e(reply.str != nullptr ? reply.str : "", reply.len);
  const std::string answered = node.name() + ": answered " + redis::DescribeReply(reply);
  if (!redis::IsRedirect(e)) {
    if (StartsWith(e, "CLUSTERDOWN") || StartsWith(e, "TRYAGAIN")) MarkStale();
    // A full server (maxmemory with noeviction) is up: it still serves reads.
    // A key of another type is there, and not what was asked for.
    results[p.cmd] = StartsWith(e, "OOM")         ? Status::ResourceExhausted(answered)
                     : StartsWith(e, "WRONGTYPE") ? Status::DataLoss(answered)
                                                  : Status::Unavailable(answered);
    return;
  }
  auto redirect = redis::ParseRedirect(e, node.endpoint());
  if (!redirect.ok()) {
    results[p.cmd] = Status::Unavailable(answered + ": " + redirect.status().message());
    return;
  }
  if (p.redirects >= options_.max_redirects) {
    results[p.cmd] = Status::Unavailable(answered + " after max_redirects (" +
                                         std::to_string(options_.max_redirects) + ") redirects");
    return;
  }
  std::shared_ptr<RedisNode> target;
  {
    std::lock_guard lock(mu_);
    const uint16_t i = IndexLocked(redirect->target);
    if (i == kNoOwner) {
      results[p.cmd] = Status::Unavailable(answered + ": more than " + std::to_string(kMaxNodes) +
                                           " nodes seen");
      return;
    }
    target = nodes_[i];
    if (!redirect->ask) {
      owner_[redirect->slot] = i;
      stale_ = true;
    }
  }
  auto& counter = redirect->ask ? counters_.ask : counters_.moved;
  counter.fetch_add(1, std::memory_order_relaxed);
  next.push_back(Pending{p.cmd, p.redirects + 1, std::move(target), redirect->ask});
}

Result<std::unique_ptr<RedisCluster>> RedisCluster::Create(const RedisClusterOptions& options) {
  if (Status s = options.Validate(); !s.ok()) return s;
  return std::unique_ptr<RedisCluster>(new RedisCluster(std::make_unique<Impl>(options)));
}

RedisCluster::RedisCluster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RedisCluster::~RedisCluster() = default;

void RedisCluster::GetMany(std::span<Get> gets) {
  std::vector<Command> cmds;
  cmds.reserve(gets.size());
  for (Get& g : gets) {
    g.bytes = 0;
    cmds.push_back(MakeCommand(g.key, {"GET", g.key}));
    cmds.back().bound = redis::RedisConnection::GetReply(g.dst.size());
    cmds.back().reply_bytes = g.dst.size();
  }
  auto results = impl_->Run(cmds, [&](size_t i, const redisReply& r, const std::string& node) {
    Get& g = gets[i];
    if (r.type == REDIS_REPLY_NIL) return Status::NotFound("no such key");
    if (r.type != REDIS_REPLY_STRING || (r.str == nullptr && r.len != 0)) {
      return Status::Unavailable(node + ": GET answered " + redis::DescribeReply(r) +
                                 ", not a string");
    }
    g.bytes = r.len;
    if (r.len > g.dst.size()) {
      return Status::DataLoss("the value's " + std::to_string(r.len) + " bytes do not fit in " +
                              std::to_string(g.dst.size()));
    }
    if (r.len != 0) std::memcpy(g.dst.data(), r.str, r.len);
    return Status::Ok();
  });
  for (size_t i = 0; i < gets.size(); ++i) gets[i].result = std::move(results[i]);
}

void RedisCluster::SetMany(std::span<Set> sets, uint32_t expire_seconds) {
  const std::string ex = std::to_string(expire_seconds);
  std::vector<Command> cmds;
  cmds.reserve(sets.size());
  for (const Set& s : sets) {
    const std::string_view value(reinterpret_cast<const char*>(s.value.data()), s.value.size());
    cmds.push_back(expire_seconds == 0 ? MakeCommand(s.key, {"SET", s.key, value})
                                       : MakeCommand(s.key, {"SET", s.key, value, "EX", ex}));
  }
  auto results = impl_->Run(cmds, [](size_t, const redisReply& r, const std::string& node) {
    if (r.type == REDIS_REPLY_STATUS && std::string_view(r.str, r.len) == "OK") {
      return Status::Ok();
    }
    return Status::Unavailable(node + ": SET answered " + redis::DescribeReply(r));
  });
  for (size_t i = 0; i < sets.size(); ++i) sets[i].result = std::move(results[i]);
}

void RedisCluster::ExistsMany(std::span<Exists> keys) {
  std::vector<Command> cmds;
  cmds.reserve(keys.size());
  for (Exists& e : keys) {
    e.found = false;
    cmds.push_back(MakeCommand(e.key, {"EXISTS", e.key}));
  }
  auto results = impl_->Run(cmds, [&](size_t i, const redisReply& r, const std::string& node) {
    if (r.type != REDIS_REPLY_INTEGER) {
      return Status::Unavailable(node + ": EXISTS answered " + redis::DescribeReply(r));
    }
    keys[i].found = r.integer > 0;
    return Status::Ok();
  });
  for (size_t i = 0; i < keys.size(); ++i) keys[i].result = std::move(results[i]);
}

void RedisCluster::DelMany(std::span<Del> keys) {
  std::vector<Command> cmds;
  cmds.reserve(keys.size());
  for (const Del& d : keys) cmds.push_back(MakeCommand(d.key, {"DEL", d.key}));
  auto results = impl_->Run(cmds, [](size_t, const redisReply& r, const std::string& node) {
    if (r.type != REDIS_REPLY_INTEGER) {
      return Status::Unavailable(node + ": DEL answered " + redis::DescribeReply(r));
    }
    return Status::Ok();
  });
  for (size_t i = 0; i < keys.size(); ++i) keys[i].result = std::move(results[i]);
}

bool RedisCluster::cluster_mode() const { return impl_->cluster_mode(); }
std::vector<RedisEndpoint> RedisCluster::Masters() const { return impl_->Masters(); }
RedisCluster::Counters RedisCluster::counters() const { return impl_->counters(); }

}  // namespace kvtier
