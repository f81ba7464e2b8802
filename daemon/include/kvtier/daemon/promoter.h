// Promoter: CacheCore's promotions of a cached prefix from NVMe, or from the
// remote tier, into DRAM.
//
// A promotion is a client's Prefetch ticket, or the promotion of a Lookup with
// acquire (which completes that Lookup through its continuation). Its leading
// chunks already in DRAM are pinned at the start; the core's I/O workers run
// Step, which reads up to one batch of the rest into freshly allocated DRAM
// slots (with the core's mutex dropped), checks each image, inserts and pins
// it, and queues the promotion again until it is done. A batch reads NVMe
// while the next chunk is there, else the remote tier (when on); every image
// read, from either, gets a fresh sequence (DESIGN.md: the lapsed-lease check);
// the first remote miss ends the promotion. A ticket then holds its
// chunks until a Lookup takes them over, its deadline passes or its session
// ends; a Lookup's promotion leaves the table and runs its continuation.
//
// Thread-safety: it shares the DRAM tier's mutex with CacheCore (`mu`).
// Methods marked "REQUIRES: mu held" are CacheCore's to call under it; Step
// takes it itself.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvtier/clock.h"
#include "kvtier/daemon/core_namespace.h"
#include "kvtier/daemon/hbm_copier.h"
#include "kvtier/daemon/nvme_health.h"
#include "kvtier/latency_histogram.h"
#include "kvtier/status.h"
#include "kvtier/tiers/dram_tier.h"
#include "kvtier/tiers/nvme_tier.h"
#include "kvtier/tiers/remote_tier.h"

namespace kvtier {

class Promoter {
 public:
  struct Promotion {
    uint64_t session_id = 0;
    uint64_t held_bytes = 0;  // counted against its session: keys.size() slots
    Clock::TimePoint expiry;
    CoreNamespace ns;               // a copy, as at the start
    std::vector<ChunkKey> keys;     // the cached prefix to make ready
    std::vector<int32_t> tokens;    // its tokens, keys.size() * chunk_tokens
    std::vector<uint32_t> ready;    // pinned DRAM handles of keys[0, ready.size())
    std::vector<bool> from_remote;  // ready[i] was read from the remote tier (i < size())
    uint32_t dram_at_start = 0;     // of ready, how many were in DRAM at the start
    bool done = false;              // no more will become ready
    bool to_hbm = false;            // a ticket that also copies its ready chunks into HBM
    std::string request;            // a ticket's RequestLedger key
    std::chrono::steady_clock::time_point started;  // set by Start (promotion latency)
    // A Lookup's continuation (unset for a ticket), run without mu once the
    // promotion is done and out of the table; `ready` is still pinned then.
    std::function<void(Promotion&)> on_done;

    bool is_ticket() const { return !on_done; }
  };
  using Table = std::unordered_map<uint64_t, Promotion>;
  // What promotions did, for the stats.
  struct Counters {
    uint64_t read_bytes = 0;         // payload bytes promoted from NVMe
    uint64_t prefetched_chunks = 0;  // of those, promoted for tickets
    uint64_t remote_read_bytes = 0;  // payload bytes promoted from the remote tier
  };
  // What a promotion needs from the core, called with mu held.
  struct Hooks {
    // The live state of namespace `id`; nullptr once it was made room for.
    std::function<CoreNamespace*(const NamespaceId& id)> live_namespace;
    // CacheCore::TokenCheck: whether DRAM chunk `h` holds chunk i of `tokens`.
    std::function<bool(const CoreNamespace& ns, const std::vector<ChunkKey>& keys,
                       std::span<const int32_t> tokens, size_t i, uint32_t h)>
        token_check;
    // Adds (hold) or takes back (drop) bytes held by a session.
    std::function<void(uint64_t session_id, uint64_t bytes)> hold, drop;
    // The first of `n` fresh slot sequences: every promoted image, from NVMe or the remote
    // tier, gets one.
    std::function<uint64_t(size_t n)> take_sequences;
    // DRAM chunk `h` was just promoted from the remote tier (not on NVMe).
    std::function<void(uint32_t h)> remote_promoted;
  };

  // Everything given must outlive the promoter. `nvme` and `health` are both
  // null (no NVMe tier: nothing is ever queued for Step) or both set; `hbm` is
  // null without an HBM tier (then no promotion has to_hbm). `work_cv` wakes
  // the core's I/O workers. `remote`: null without a remote tier.
  Promoter(std::mutex& mu, DramTier& dram, NvmeTier* nvme, NvmeHealth* health, HbmCopier* hbm,
           RemoteTier* remote, std::condition_variable& work_cv, Hooks hooks);

  // REQUIRES: mu held. Starts promotion `id` (its `ready` already pinned);
  // queues it for a worker unless it is done.
  void Start(uint64_t id, Promotion p);
  // REQUIRES: mu held. Ends it early: unpins its chunks and gives back its bytes.
  void End(Table::iterator it);
  // REQUIRES: mu held. A client's ticket. Errors as FindOwned (a Lookup's own
  // promotion is NOT_FOUND too).
  Result<Table::iterator> FindTicket(uint64_t ticket, uint64_t session_id);
  // REQUIRES: mu held. A ticket of any session, for request `request` (a
  // RequestLedger key, not empty) in namespace `ns`: NOT_FOUND when it is gone
  // (or is a Lookup's own promotion), INVALID_ARGUMENT when it is another
  // request's or another namespace's.
  Result<Table::iterator> FindRequestTicket(uint64_t ticket, const std::string& request,
                                            const NamespaceId& ns);
  // REQUIRES: mu held. Ends the tickets of a session that ended (its Lookups'
  // promotions finish on their workers, which then see it gone); returns how many.
  size_t EndSession(uint64_t session_id);
  // REQUIRES: mu held. Ends the tickets past their deadline; returns how many.
  size_t ExpireTickets(Clock::TimePoint now);
  // REQUIRES: mu held. Tickets open (what stats call active_prefetches).
  size_t ActiveTickets() const;
  // REQUIRES: mu held. DRAM slot bytes the tickets hold: at most half the
  // arena, so that tickets never starve stores and lookups of room.
  uint64_t ticket_bytes() const { return ticket_bytes_; }
  // REQUIRES: mu held. An admin eviction starts: reads in flight keep nothing.
  void NoteEviction() { ++evict_generation_; }
  // REQUIRES: mu held. Whether a promotion waits for a worker.
  bool HasWork() const { return !queue_.empty(); }
  // REQUIRES: mu held. The next promotion to step, if any.
  std::optional<uint64_t> NextWork();
  // REQUIRES: mu not held. One step of promotion `id` (up to one batch of
  // reads), then queues it again or finishes it.
  void Step(uint64_t id);
  // REQUIRES: mu held.
  const Counters& counters() const { return counters_; }
  // Promotions from Start to done, and their batches of NVMe reads (any thread).
  const LatencyHistogram& promotion_latency() const { return promotion_latency_; }
  const LatencyHistogram& nvme_read_latency() const { return nvme_read_latency_; }
  const LatencyHistogram& remote_read_latency() const { return remote_read_latency_; }

 private:
  // Ends the tickets `pred` picks; returns how many.
  template <typename Pred>
  size_t EndTicketsIf(Pred pred);
  // Marks it done; a Lookup's promotion leaves the table and its continuation
  // runs (with `lock` dropped).
  void Finish(std::unique_lock<std::mutex>& lock, Table::iterator it);
  // REQUIRES: mu held. Pins and adds to `p.ready` the next chunks already in
  // DRAM that pass the token check; false when one fails it (the promotion
  // must stop there).
  bool JoinResident(Promotion& p, const CoreNamespace& ns);
  // REQUIRES: mu not held. ReadMany from the remote tier (each image verified).
  Status ReadRemote(std::span<NvmeTier::ReadRequest> reads);

  std::mutex& mu_;
  DramTier& dram_;
  NvmeTier* const nvme_;
  NvmeHealth* const health_;
  HbmCopier* const hbm_;
  RemoteTier* const remote_;
  std::condition_variable& work_cv_;
  const Hooks hooks_;
  Table promotions_;               // GUARDED_BY(mu_)
  std::deque<uint64_t> queue_;     // GUARDED_BY(mu_)
  uint64_t ticket_bytes_ = 0;      // GUARDED_BY(mu_)
  uint64_t evict_generation_ = 0;  // GUARDED_BY(mu_)
  Counters counters_;              // GUARDED_BY(mu_)
  LatencyHistogram promotion_latency_, nvme_read_latency_, remote_read_latency_;
};

}  // namespace kvtier
