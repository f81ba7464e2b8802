// kvtierctl events: kvtierd's KV events, live, one line per event.
#include <cstdio>
#include <optional>

#include "ctl.h"
#include "kvtier/tools/kv_event_subscriber.h"

namespace kvtier::ctl {
namespace {

using nlohmann::json;
using tools::KvEventSubscriber;

// Prints events and tells gaps in the sequence numbers; counts what it printed.
class EventPrinter {
 public:
  EventPrinter(KvEventSubscriber& sub, bool as_json, bool has_replay, uint64_t count)
      : sub_(sub), as_json_(as_json), has_replay_(has_replay), count_(count) {}

  // Prints `m` unless it was printed already, first the batches missed
  // before it (from the replay socket, when there is one) and then, if some
  // are still missing, a gap. Returns true once `count` events are printed.
  bool Deliver(const KvEventSubscriber::Message& m, std::optional<uint64_t> want_from) {
    if (last_ && m.seq <= *last_) return Done();
    const std::optional<uint64_t> want = last_ ? std::optional<uint64_t>(*last_ + 1) : want_from;
    if (want && m.seq > *want && has_replay_) {
      auto missed = sub_.Replay(*want, std::chrono::seconds(2));
      if (missed.ok()) {
        for (const auto& r : *missed) {
          if (r.seq >= m.seq || (last_ && r.seq <= *last_)) continue;
          if (last_ && r.seq > *last_ + 1) Gap(*last_ + 1, r.seq - 1);
          Print(r);
          if (Done()) return true;
        }
      } else {
        std::fprintf(stderr, "kvtierctl events: replay: %s\n", missed.status().message().c_str());
      }
    }
    const uint64_t next = last_ ? *last_ + 1 : want.value_or(m.seq);
    if (m.seq > next) Gap(next, m.seq - 1);
    Print(m);
    return Done();
  }

 private:
  bool Done() const { return count_ > 0 && printed_ >= count_; }

  void Gap(uint64_t first, uint64_t last) {
    if (as_json_) {
      std::printf("%s\n", json{{"gap", {{"first_seq", first}, {"last_seq", last}}}}.dump().c_str());
    } else {
      std::printf(
          "gap: batches %llu..%llu are lost (dropped by kvtierd when its event queue was "
          "full, or older than its replay buffer); a view built from events is "
          "incomplete: rebuild it from kvtierctl ls\n",
          static_cast<unsigned long long>(first), static_cast<unsigned long long>(last));
    }
    std::fflush(stdout);
  }

  void Print(const KvEventSubscriber::Message& m) {
    last_ = m.seq;
    for (const KvEvent& e : m.batch.events) {
      if (Done()) return;
      ++printed_;
      std::string hashes;
      for (const ChunkKey& k : e.block_hashes) hashes += (hashes.empty() ? "" : ",") + k.ToHex();
      const bool stored = e.type == KvEventType::kBlockStored;
      const bool cleared = e.type == KvEventType::kAllBlocksCleared;
      if (as_json_) {
        json j = {{"seq", m.seq}, {"ts", m.batch.ts}, {"type", KvEventTypeName(e.type)}};
        if (!cleared) {
          j["medium"] = KvMediumName(e.medium);
          j["block_hashes"] = json::array();
          for (const ChunkKey& k : e.block_hashes) j["block_hashes"].push_back(k.ToHex());
        }
        if (stored) {
          j["parent_block_hash"] = e.parent ? json(e.parent->ToHex()) : json(nullptr);
          j["num_tokens"] = e.token_ids.size();
          j["block_size"] = e.block_size;
        }
        std::printf("%s\n", j.dump().c_str());
      } else if (cleared) {
        std::printf("%llu - AllBlocksCleared\n", static_cast<unsigned long long>(m.seq));
      } else {
        std::printf("%llu %s %s %s", static_cast<unsigned long long>(m.seq),
                    std::string(KvMediumName(e.medium)).c_str(),
                    std::string(KvEventTypeName(e.type)).c_str(), hashes.c_str());
        if (stored) {
          std::printf(" parent=%s tokens=%zu", e.parent ? e.parent->ToHex().c_str() : "-",
                      e.token_ids.size());
        }
        std::printf("\n");
      }
    }
    std::fflush(stdout);
  }

  KvEventSubscriber& sub_;
  const bool as_json_;
  const bool has_replay_;
  const uint64_t count_;
  uint64_t printed_ = 0;
  std::optional<uint64_t> last_;  // the last batch printed
};

}  // namespace

int RunEvents(AdminClient* admin, const std::string& socket_path, bool as_json, EventsArgs args) {
  if (args.address.empty()) {  // the daemon's own
    auto settings = admin->Config();
    if (!settings.ok()) return Fail(socket_path, as_json, settings.status());
    for (const DaemonSetting& s : *settings) {
      if (s.key == "events_address") args.address = s.value;
      if (s.key == "events_replay_address" && args.replay_address.empty()) {
        args.replay_address = s.value;
      }
    }
    if (args.address.empty()) {
      std::fprintf(stderr,
                   "kvtierctl events: kvtierd on %s publishes no KV events (start it "
                   "with --events-address), or give --address\n",
                   socket_path.c_str());
      return 1;
    }
  }
  if (args.from && args.replay_address.empty()) {
    std::fprintf(stderr,
                 "kvtierctl events: --from needs a replay address (kvtierd "
                 "--events-replay-address, or --replay-address)\n");
    return 2;
  }
  auto sub = KvEventSubscriber::Connect(args.address, args.replay_address);
  if (!sub.ok()) {  // a malformed endpoint (ZMQ connects in the background): a usage error
    std::fprintf(stderr, "kvtierctl events: %s\n", sub.status().message().c_str());
    return sub.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  EventPrinter printer(**sub, as_json, !args.replay_address.empty(), args.count);
  if (args.from) {
    auto past = (*sub)->Replay(*args.from, std::chrono::seconds(5));
    if (!past.ok()) {
      std::fprintf(stderr, "kvtierctl events: replay from %s: %s\n", args.replay_address.c_str(),
                   past.status().message().c_str());
      return 1;
    }
    for (const auto& m : *past) {
      if (printer.Deliver(m, args.from)) return 0;
    }
  }
  for (;;) {
    auto m = (*sub)->Next(std::chrono::milliseconds(500));
    if (!m.ok()) {
      std::fprintf(stderr, "kvtierctl events: %s\n", m.status().message().c_str());
      return 1;
    }
    if (m->has_value() && printer.Deliver(**m, args.from)) return 0;
  }
}

}  // namespace kvtier::ctl
