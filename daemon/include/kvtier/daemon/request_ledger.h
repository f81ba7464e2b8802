// RequestLedger: which engine requests the token hit rate has counted
// (DESIGN.md "token hit rate": once per engine request, only for bytes served).
//
// An engine request reaches kvtierd as several calls: the scheduler's Lookup,
// a Prefetch, and one leased Lookup per worker (one per TP rank). They share
// the engine's request id (LookupRequest/PrefetchRequest.request_id), which
// names the request here; vLLM and SGLang ids are unique per engine, so the id
// alone is the key (TP ranks, whose namespaces differ, share one entry). A
// call without an id is a request of its own; a Prefetch without one names its
// request after its ticket, which the leased Lookup that takes it over uses.
//
// The ledger remembers the last `capacity` requests it saw (first seen, first
// forgotten); a request older than that counts again, as a new one.
//
// Thread-safety: none; CacheCore calls it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace kvtier {

class RequestLedger {
 public:
  // Requests remembered (at least 1). Default: 65,536 (a few MiB at most).
  explicit RequestLedger(size_t capacity = 65536) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The key of a request named by the engine, and of an unnamed Prefetch's
  // ticket; "" (an unnamed call) is a request of its own.
  static std::string Named(std::string_view request_id) {
    return request_id.empty() ? std::string() : "n" + std::string(request_id);
  }
  static std::string Ticket(uint64_t ticket) { return "t" + std::to_string(ticket); }

  // True the first time request `key` is seen, when its prompt (of
  // `prompt_chunks` full chunks) is counted; always true for "".
  bool FirstSight(const std::string& key, uint64_t prompt_chunks);

  // Chunks [from, to) of a lease are new hits of its request; the lease covers
  // its chunks [0, covers) (Credit's answer: what End needs back).
  struct Range {
    uint64_t from = 0;
    uint64_t to = 0;
    uint64_t covers = 0;
  };
  // A lease of request `key` covers its chunks [first, served): the ones
  // before `first` the engine held already (they are leased, as the prefix,
  // but never hits). Returns the chunks it credits: those not credited before,
  // and never past the full chunks of the prompt counted at its first sight (a
  // client may reuse an id for a longer prompt), so each chunk of a request
  // counts as a hit once and hits never exceed the prompt. For "" (an unnamed
  // call): [first, served). Every Credit is followed by one End.
  Range Credit(const std::string& key, uint64_t first, uint64_t served);
  // The lease whose Credit returned `credited` ended: served (its client read
  // it, or may have), or not (its client never got the answer). Returns what
  // is taken back: for an unserved lease, the part of `credited` that no other
  // lease of the request covers (one still held, or ended served: with tensor
  // parallelism each rank leases the same chunks, and only the first is
  // credited), provided nothing was credited after it; nothing otherwise.
  Range End(const std::string& key, Range credited, bool served);

  size_t size() const { return credited_.size(); }

 private:
  struct Entry {
    uint64_t prompt_chunks = 0;    // full chunks of the prompt counted
    uint64_t credited = 0;         // leading chunks credited as hits
    uint64_t kept = 0;             // chunks covered by leases that ended served
    std::multiset<uint64_t> held;  // chunks covered by each lease not ended
  };
  // Remembers `key` (forgetting the oldest past capacity): its entry, and
  // whether it is new.
  std::pair<Entry*, bool> Remember(const std::string& key);

  const size_t capacity_;
  std::unordered_map<std::string, Entry> credited_;  // key -> what was counted
  std::deque<std::string> order_;                    // keys, first seen first
};

}  // namespace kvtier
