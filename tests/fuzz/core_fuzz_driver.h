// CoreFuzzDriver: drives one CacheCore (small DRAM arena, and optionally a small NVMe tier in
// memory, see memory_nvme.h) with a sequence of calls decoded from a fuzz input, the
// way clients would make them, and checks the core's promises after each call.
//
// Each call starts from a request message parsed from raw input bytes (any field, unknown
// fields, garbage); a mask byte then replaces the fields it leaves clear with well-formed
// values (an open session, the arena epoch, an open namespace, a prompt from a small token
// alphabet so that prompts share prefixes, correctly chained chunk keys, ids the core handed
// out). A zero mask is a well-formed call; set bits keep the raw field.
//
// Checks (a failure aborts, which libFuzzer records as a crash):
//   - every call returns; a rejected one changes nothing Stats or Namespaces show;
//   - responses are consistent (counts, offsets inside the arena, one location per leased
//     chunk) and a leased chunk's slot holds exactly that chunk: header (namespace, key,
//     parent, tokens), sequence and payload bytes as the client wrote them, also after NVMe
//     round trips, restarts and corrupted NVMe bytes;
//   - Stats agree with a model of sessions, leases, reservations and prefetch tickets;
//   - once every session ends, no lease, reservation, ticket or slot is left over: DRAM's
//     used bytes are its chunks' slots.
//
// Thread-safety: not thread-safe; one driver per input. The core's I/O workers run
// promotions, which the driver waits for (a Lookup returns once done; a prefetch is polled
// until done), so that the core is quiescent between calls.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kvtier/arena.h"
#include "kvtier/daemon/cache_core.h"
#include "kvtier/v1/kvtier.pb.h"
#include "memory_nvme.h"
#include "testing/manual_clock.h"

namespace kvtier::fuzz {

class CoreFuzzDriver {
 public:
  // Reads the configuration from `in` and starts the core, with an NVMe tier (in memory)
  // when `nvme`. `in` must outlive the driver.
  CoreFuzzDriver(FuzzedDataProvider& in, bool nvme);
  ~CoreFuzzDriver();

  // Decodes and makes one call, then checks. False once the input is used up.
  bool Step();
  // Ends every session and checks that nothing is left over.
  void Finish();

 private:
  struct Ns {
    std::string wire;
    NamespaceSpec spec;
    NamespaceId id;
    SlotLayout layout;
  };
  struct Held {  // a lease, reservation or ticket the core handed out
    uint64_t session = 0;
    uint64_t id = 0;
    Clock::TimePoint expiry;
  };

  void Start();    // (re)creates the core over the same NVMe disks and index
  void Restart();  // at most once an input

  // Calls, one per op.
  void OpenSession();
  void EndSession();
  void OpenNamespace();
  void Lookup();
  void Prefetch();
  void PrefetchStatus();
  void Release();
  void Reserve();
  void Commit();
  void Abort();
  void EndReservation(bool commit);  // CommitWrite, or AbortWrite
  void Evict();
  void AdvanceClock();
  void WriteNvme();
  void DamageNvme();
  void Scribble();

  // Well-formed field values, or the raw ones when `keep_raw`.
  uint64_t PickSession(bool keep_raw, uint64_t raw);
  const Ns* PickNs();
  std::vector<int32_t> Prompt(const Ns& ns);
  uint64_t PickId(const std::vector<Held>& from, bool keep_raw, uint64_t raw);
  template <typename Message>
  void ParseRaw(Message* m);

  // Checks a response to a Lookup with acquire against the chunks of `tokens`.
  void CheckLease(const Ns& ns, const std::vector<int32_t>& tokens, const v1::LookupResponse& resp,
                  bool acquire, uint32_t max_chunks);
  // What a rejected call must leave as it was.
  std::string Snapshot();
  void CheckRejected(const Status& st, const std::string& before, const char* call);
  // Stats against the model; REQUIRES: the core is quiescent.
  void CheckStats();
  void Expire(std::vector<Held>& held);  // drops what ExpireNow ends
  void DropSession(uint64_t session);
  // Removes `id` of `session` from `held`; whether it was there.
  static bool Take(std::vector<Held>& held, uint64_t id, uint64_t session);

  FuzzedDataProvider& in_;
  CacheCoreOptions options_;
  uint64_t epoch_ = 0x5EED;
  testing::ManualClock clock_;
  std::vector<std::shared_ptr<MemoryDisk>> disks_;
  std::vector<MemoryBlockDevice*> devices_;  // owned by the core's NVMe tier
  std::unique_ptr<MemoryIndexDir> index_dir_;
  std::unique_ptr<CacheCore> core_;
  std::unique_ptr<Arena> client_arena_;

  std::vector<uint64_t> sessions_;        // open
  std::vector<uint64_t> ended_sessions_;  // for stale ids
  std::vector<Ns> namespaces_;            // opened OK (possibly reused by the core since)
  std::vector<Held> leases_, reservations_, tickets_;
  std::vector<uint64_t> used_ids_;  // every id handed out, for stale ones
  // Keys whose payload the client did not write (their bytes are unknown).
  std::set<std::pair<uint64_t, uint64_t>> unwritten_;
  bool scribbled_ = false;  // the client wrote over the arena at random
  bool restarted_ = false;
  uint64_t calls_ = 0;
};

}  // namespace kvtier::fuzz
