#include "nodes.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "kvtier/admin_client.h"
#include "kvtier/kv_event.h"
#include "kvtier/tools/kv_event_subscriber.h"

namespace kvtier::replay {
namespace {

// The chunks each node holds in any tier, from the nodes' KV events alone.
class EventIndex {
 public:
  struct Endpoints {
    std::string events, replay;  // replay "": none
  };
  // Subscribes to each node's events; where a node has a replay endpoint, its
  // buffered batches are read first (what it held before the replay started).
  static Result<std::unique_ptr<EventIndex>> Connect(const std::vector<Endpoints>& nodes) {
    auto index = std::unique_ptr<EventIndex>(new EventIndex(nodes.size()));
    for (size_t node = 0; node < nodes.size(); ++node) {
      const std::string replay =
          nodes[node].replay.empty() ? "" : tools::ConnectableAddress(nodes[node].replay);
      auto sub =
          tools::KvEventSubscriber::Connect(tools::ConnectableAddress(nodes[node].events), replay);
      if (!sub.ok()) return sub.status();
      index->subs_.push_back(std::move(sub).value());
      if (replay.empty()) continue;
      auto earlier = index->subs_.back()->Replay(0, std::chrono::seconds(5));
      if (!earlier.ok()) return earlier.status();
      for (const auto& m : *earlier) index->Apply(node, m);
    }
    return index;
  }

  // Applies every batch that has come in, first waiting up to `wait` for one
  // from node `expect` (the node that served the last request).
  void Drain(size_t expect, std::chrono::milliseconds wait) {
    for (size_t node = 0; node < subs_.size(); ++node) {
      for (auto timeout = node == expect ? wait : std::chrono::milliseconds(0);;
           timeout = std::chrono::milliseconds(0)) {
        auto next = subs_[node]->Next(timeout);
        if (!next.ok() || !next->has_value()) break;  // a malformed batch only costs precision
        Apply(node, **next);
      }
    }
  }

  // How many of `keys`, from the first, node `node` holds.
  size_t HeldRun(size_t node, std::span<const ChunkKey> keys) const {
    size_t n = 0;
    while (n < keys.size() && held_[node].count(keys[n]) > 0) ++n;
    return n;
  }

  uint64_t events() const { return events_; }
  uint64_t gaps() const { return gaps_; }

 private:
  explicit EventIndex(size_t nodes) : held_(nodes), last_seq_(nodes) {}

  void Apply(size_t node, const tools::KvEventSubscriber::Message& m) {
    if (last_seq_[node] && m.seq <= *last_seq_[node]) return;  // seen (replay, then live)
    if (last_seq_[node] && m.seq > *last_seq_[node] + 1) ++gaps_;
    last_seq_[node] = m.seq;
    auto& held = held_[node];
    for (const KvEvent& e : m.batch.events) {
      ++events_;
      const auto bit = static_cast<uint8_t>(1u << static_cast<unsigned>(e.medium));
      switch (e.type) {
        case KvEventType::kBlockStored:
          for (const ChunkKey& k : e.block_hashes) held[k] |= bit;
          break;
        case KvEventType::kBlockRemoved:
          for (const ChunkKey& k : e.block_hashes) {
            auto it = held.find(k);
            if (it != held.end() && (it->second &= static_cast<uint8_t>(~bit)) == 0) held.erase(it);
          }
          break;
        case KvEventType::kAllBlocksCleared:
          held.clear();
          break;
      }
    }
  }

  std::vector<std::unique_ptr<tools::KvEventSubscriber>> subs_;
  // Per node: chunk key -> the media (bits of KvMedium) holding it.
  std::vector<std::unordered_map<ChunkKey, uint8_t, ChunkKeyHash>> held_;
  std::vector<std::optional<uint64_t>> last_seq_;
  uint64_t events_ = 0, gaps_ = 0;
};

// Each node's --events-address, from its effective config. Prints and sets
// *exit_code when one has none or cannot be asked.
std::vector<EventIndex::Endpoints> EventAddresses(const ReplayOptions& options,
                                                  const std::vector<std::string>& sockets,
                                                  int* exit_code) {
  std::vector<EventIndex::Endpoints> addresses;
  for (const std::string& socket : sockets) {
    auto admin = AdminClient::Connect(
        socket, std::max<std::chrono::milliseconds>(options.deadline, std::chrono::seconds(1)));
    auto config =
        admin.ok() ? (*admin)->Config() : Result<std::vector<DaemonSetting>>(admin.status());
    if (!config.ok()) {
      std::fprintf(stderr, "kvtier-replay: node %s: %s\n", socket.c_str(),
                   config.status().message().c_str());
      *exit_code = 1;
      return {};
    }
    EventIndex::Endpoints address;
    for (const DaemonSetting& s : *config) {
      if (s.key == "events_address") address.events = s.value;
      if (s.key == "events_replay_address") address.replay = s.value;
    }
    if (address.events.empty()) {
      std::fprintf(stderr,
                   "kvtier-replay: --route prefix reads the nodes' KV events, but node %s has no "
                   "--events-address\n",
                   socket.c_str());
      *exit_code = 2;
      return {};
    }
    addresses.push_back(address);
  }
  return addresses;
}

}  // namespace

Result<std::vector<std::string>> ParseNodes(const std::string& text) {
  std::vector<std::string> sockets;
  std::set<std::string> seen;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    if (item.empty()) return Status::InvalidArgument("--nodes: an empty socket in '" + text + "'");
    if (!seen.insert(item).second) {
      return Status::InvalidArgument("--nodes: socket " + item + " is named twice");
    }
    sockets.push_back(std::move(item));
    if (comma == std::string::npos) return sockets;
    start = comma + 1;
  }
}

int ReplayNodes(const ReplayOptions& options, const NodesOptions& nodes,
                std::span<const tools::TraceRequest> trace, Progress& progress,
                NodesResult& result) {
  constexpr uint64_t kLoadSlack = 8;
  int exit_code = 0;
  std::vector<std::unique_ptr<RequestRunner>> runners;
  for (const std::string& socket : nodes.sockets) {
    ReplayOptions o = options;
    o.socket_path = socket;
    runners.push_back(RequestRunner::Create(o, &exit_code));
    if (!runners.back()) return exit_code;
  }
  std::unique_ptr<EventIndex> index;
  if (nodes.route == "prefix") {
    const std::vector<EventIndex::Endpoints> addresses =
        EventAddresses(options, nodes.sockets, &exit_code);
    if (exit_code != 0) return exit_code;
    auto connected = EventIndex::Connect(addresses);
    if (!connected.ok()) {
      std::fprintf(stderr, "kvtier-replay: %s\n", connected.status().message().c_str());
      return 2;
    }
    index = std::move(connected).value();
    // A subscription takes effect a moment after connect; events before it are
    // not seen (but for what a node's replay endpoint gave).
    index->Drain(0, std::chrono::milliseconds(200));
  }
  const size_t n = nodes.sockets.size();
  result.nodes.assign(n, Totals{});
  result.requests.assign(n, 0);
  const std::string run_id = NewRunId();
  Totals all;
  size_t last = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    size_t pick = i % n;
    if (index) {
      // The last request's stores publish within a few ms (kvtierd batches every 5 ms).
      index->Drain(last, std::chrono::milliseconds(6));
      const std::vector<ChunkKey> keys = runners[0]->ChunkKeysOf(trace[i]);
      // Only nodes not far ahead of the least loaded compete: else a prefix
      // every prompt shares (a system prompt) would draw every request to one node.
      const uint64_t least = *std::min_element(result.requests.begin(), result.requests.end());
      const uint64_t bound = least + std::max<uint64_t>(kLoadSlack, least / 4);
      size_t best = 0;
      pick = std::min_element(result.requests.begin(), result.requests.end()) -
             result.requests.begin();
      for (size_t node = 0; node < n; ++node) {
        if (result.requests[node] > bound) continue;
        const size_t run = index->HeldRun(node, keys);
        if (run > best || (run == best && result.requests[node] < result.requests[pick])) {
          best = run;
          pick = node;
        }
      }
      result.routed_by_prefix += best > 0;
    }
    Totals t;
    if (!runners[pick]->Run(trace[i], run_id + std::to_string(i), t)) return 1;
    result.nodes[pick].Add(t);
    ++result.requests[pick];
    last = pick;
    all.Add(t);
    progress.Update(i + 1, all.HitRate());
  }
  progress.Finish();
  if (index) {
    index->Drain(last, std::chrono::milliseconds(0));
    result.events = index->events();
    result.event_gaps = index->gaps();
  }
  return 0;
}

int RunNodes(const ReplayOptions& options, const NodesOptions& nodes,
             std::span<const tools::TraceRequest> trace, RunInfo info, bool show_progress,
             const std::string& json_path) {
  NodesResult r;
  Progress progress(trace.size(), show_progress, "");
  // Every node's NVMe bytes, summed (unknown when one node's Stats fails).
  const auto nvme_bytes = [&]() -> NvmeBytes {
    std::pair<uint64_t, uint64_t> sum{0, 0};
    for (const std::string& socket : nodes.sockets) {
      auto admin = AdminClient::Connect(socket, std::chrono::seconds(1));
      const NvmeBytes b = NvmeCounters(admin.ok() ? admin->get() : nullptr);
      if (!b) return std::nullopt;
      sum.first += b->first;
      sum.second += b->second;
    }
    return sum;
  };
  const NvmeBytes before = nvme_bytes();
  const auto start = std::chrono::steady_clock::now();
  if (int rc = ReplayNodes(options, nodes, trace, progress, r); rc != 0) return rc;
  info.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  SetNvmeBytes(before, nvme_bytes(), info);
  Totals all;
  nlohmann::json per_node = nlohmann::json::array();
  FILE* table = json_path == "-" ? stderr : stdout;
  std::fprintf(table, "kvtier-replay over %zu nodes, route %s\n", nodes.sockets.size(),
               nodes.route.c_str());
  std::fprintf(table, "  %-5s %9s %14s %9s %14s %12s %12s\n", "node", "requests", "prompt_tokens",
               "hit_rate", "remote_tokens", "loaded_MiB", "stored_MiB");
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    const Totals& t = r.nodes[i];
    all.Add(t);
    std::fprintf(table, "  %-5zu %9llu %14llu %9.4f %14llu %12.1f %12.1f\n", i,
                 static_cast<unsigned long long>(r.requests[i]),
                 static_cast<unsigned long long>(t.prompt_tokens), t.HitRate(),
                 static_cast<unsigned long long>(t.remote_hit_tokens), t.bytes_loaded / 1048576.0,
                 t.bytes_stored / 1048576.0);
    per_node.push_back({{"socket", nodes.sockets[i]},
                        {"requests", r.requests[i]},
                        {"prompt_tokens", t.prompt_tokens},
                        {"hit_tokens", t.hit_tokens},
                        {"token_hit_rate", t.HitRate()},
                        {"remote_hit_tokens", t.remote_hit_tokens},
                        {"nvme_hit_tokens", t.nvme_hit_tokens},
                        {"bytes_loaded", t.bytes_loaded},
                        {"remote_bytes_loaded", t.remote_bytes_loaded},
                        {"bytes_stored", t.bytes_stored},
                        {"verify_errors", t.verify_errors},
                        {"fail_open", t.fail_open}});
  }
  if (nodes.route == "prefix") {
    std::fprintf(
        table, "  router: %llu KV events read, %llu gaps, %llu requests placed by prefix\n",
        static_cast<unsigned long long>(r.events), static_cast<unsigned long long>(r.event_gaps),
        static_cast<unsigned long long>(r.routed_by_prefix));
  }
  PrintSummary(table, all, info);
  nlohmann::json j = {{"route", nodes.route},
                      {"nodes", per_node},
                      {"router",
                       {{"events", r.events},
                        {"event_gaps", r.event_gaps},
                        {"routed_by_prefix", r.routed_by_prefix}}},
                      {"total", SummaryJson(all, info)}};
  if (int rc = WriteJson(json_path, j); rc != 0) return rc;
  return all.verify_errors == 0 ? 0 : 3;
}

}  // namespace kvtier::replay
