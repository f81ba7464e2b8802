// The long-running modes of kvtier_test_client, one file each (tests only).
// Each returns the process exit code: 0 when every loaded byte was right and
// no call returned an API error, 3 on a wrong byte, 1 on an API error or when
// kvtierd cannot be reached at the start, 2 on a usage error. Each prints one
// line `RESULT {json}` on stdout at the end.
#pragma once

#include <cstdint>
#include <string>

#include "testing/test_client_common.h"

namespace kvtier::testclient {

// crash_worker.cc. Until SIGTERM (or `duration_ms`, when nonzero): grows its
// own conversations [first_conversation, first_conversation + conversations)
// turn by turn (a load, every byte checked, then a store of the new chunks),
// one turn every `store_interval_ms` at most, and in between loads (some after
// a prefetch) and lookups of random turns of the conversations before
// first_conversation and of its own, failing open while kvtierd is down.
// RESULT says how many turns it stored.
struct CrashWorkerOptions {
  uint64_t seed = 1;
  uint64_t first_conversation = 0;
  uint64_t conversations = 4;
  uint64_t store_interval_ms = 0;
  uint64_t duration_ms = 0;
};
int CrashWorker(const Common& c, const CrashWorkerOptions& o);

// crash_worker.cc. Loads every chunk conversations [0, conversations) can
// have (the last turn without its tail), checks every byte, and writes the
// keys of the chunks served right to `keys_out` (hex, one a line; "" = none).
// After each load a lookup (no lease) asks what is cached: RESULT's
// short_loads counts the loads that got less, each described on stderr.
int ReadBack(const Common& c, uint64_t conversations, const std::string& keys_out);

// dying_client.cc. Takes and keeps leases (Acquire), reservations (Reserve,
// payloads partly written) and prefetch tickets on the documents of a shared
// set, and stores and loads them (every byte checked), in a random order that
// `seed` picks, until killed. After each step it prints
// `HELD {"leases":L,"reservations":R,"tickets":T,"steps":S}`.
int Die(const Common& c, uint64_t seed);

// load_client.cc. `clients` threads, each with its own Client (session),
// over `namespaces` namespaces: lookup, load (every byte checked), store and
// prefetch + load for `seconds`. RESULT gives calls, errors, fail-opens,
// wrong bytes, and per call kind its count, throughput and p50/p99/max.
struct LoadOptions {
  uint32_t clients = 32;
  uint32_t namespaces = 4;
  uint32_t conversations = 64;  // per namespace
  double seconds = 60;
  uint64_t seed = 1;
};
int LoadRun(const Common& c, const LoadOptions& o);

}  // namespace kvtier::testclient
