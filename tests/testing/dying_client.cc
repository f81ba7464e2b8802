// kvtier_test_client die: a client of the client-death loop
// (tests/integration/client_death_test.cc). It never exits by itself: the test
// kills it with SIGKILL at a random point, often while it holds leases,
// reservations with half-written payloads and prefetch tickets.
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <nlohmann/json.hpp>

#include "kvtier/tools/model_presets.h"
#include "testing/test_client_modes.h"

namespace kvtier::testclient {
namespace {

// Shared by every dying client, hot to cold: 640 * 6 chunks of 20 KiB (tiny,
// 32 tokens) outgrow a 64 MiB arena, so the cold ones are read from NVMe.
constexpr uint64_t kDocuments = 640;
constexpr uint32_t kDocChunks = 6;
constexpr size_t kMostHeld = 4;  // of each kind; past it the oldest is let go

std::vector<int32_t> Document(uint64_t d, uint32_t chunk_tokens) {
  std::vector<int32_t> tokens;
  AppendTokens(&tokens, Mix(0xD0C0000 + d), 0, uint64_t{kDocChunks} * chunk_tokens);
  return tokens;
}

// Wrong bytes in the leased chunks that were still valid after the copy.
void CheckLease(const ChunkLease& lease, const std::vector<ChunkKey>& keys, uint32_t num_layers,
                PayloadCheck* check) {
  std::vector<uint64_t> errors(lease.num_chunks());
  for (uint32_t i = 0; i < lease.num_chunks(); ++i) {
    errors[i] = tools::CountPayloadErrors(keys[i], num_layers, lease.payload(i));
  }
  const uint32_t valid = lease.ValidChunks();
  for (uint32_t i = 0; i < valid; ++i) {
    ++check->checked_chunks;
    if (errors[i] == 0) continue;
    ++check->bad_chunks;
    check->wrong_bytes += errors[i];
    std::fprintf(stderr, "kvtier_test_client[%d]: leased chunk %u (%s): %llu bytes differ\n",
                 static_cast<int>(getpid()), i, keys[i].ToHex().c_str(),
                 static_cast<unsigned long long>(errors[i]));
  }
}

}  // namespace

int Die(const Common& c, uint64_t seed) {
  auto spec = tools::ModelPreset(c.model, c.chunk_tokens);
  if (!spec.ok()) return 2;
  auto client_or = ConnectOrFail(c, "kvtier_test_client die");
  if (!client_or.ok()) {
    std::fprintf(stderr, "kvtier_test_client: %s\n", client_or.status().ToString().c_str());
    return 1;
  }
  Client& client = **client_or;
  auto ns_or = client.OpenNamespace(*spec);
  if (!ns_or.ok()) return 1;
  const NamespaceHandle ns = *ns_or;
  const uint32_t ct = c.chunk_tokens, layers = spec->num_layers;
  const uint64_t pb = ns.layout.payload_bytes;
  PayloadCheck check{layers, pb};
  std::vector<std::byte> buffer(kDocChunks * pb);
  std::deque<ChunkLease> leases;
  std::deque<std::pair<ChunkReservation, std::vector<ChunkKey>>> reservations;
  std::deque<std::pair<PrefetchTicket, std::vector<int32_t>>> tickets;
  uint64_t rng = Mix(seed ^ (uint64_t{static_cast<uint32_t>(getpid())} << 32));
  auto api_error = [](const char* what, const Status& st) {
    std::fprintf(stderr, "kvtier_test_client: API error in %s: %s\n", what, st.ToString().c_str());
  };
  for (uint64_t step = 1;; ++step) {
    rng = Mix(rng);
    const uint64_t hot_to_cold = (rng % kDocuments) * ((rng >> 16) % kDocuments) / kDocuments;
    const std::vector<int32_t> doc = Document(hot_to_cold, ct);
    const std::vector<ChunkKey> keys = Client::ChunkKeys(ns, doc);
    switch ((rng >> 32) % 6) {
      case 0: {  // store a document
        auto r = client.Store(ns, doc, PatternWriter(keys, layers));
        if (!r.ok()) api_error("Store", r.status());
        break;
      }
      case 1: {  // lease it and keep the lease
        auto lease = client.Acquire(ns, doc);
        if (!lease.ok()) {
          api_error("Acquire", lease.status());
          break;
        }
        CheckLease(*lease, keys, layers, &check);
        if (lease->held()) leases.push_back(std::move(*lease));
        if (leases.size() > kMostHeld) leases.pop_front();  // released in the background
        break;
      }
      case 2: {  // reserve a continuation of it, write half, keep the reservation
        std::vector<int32_t> tokens = doc;
        AppendTokens(&tokens, Mix(rng ^ step), tokens.size(), (1 + (rng >> 8) % 3) * ct);
        const std::vector<ChunkKey> all = Client::ChunkKeys(ns, tokens);
        auto res = client.Reserve(ns, tokens);
        if (!res.ok()) {
          api_error("Reserve", res.status());
          break;
        }
        for (size_t k = 0; k < res->size() / 2; ++k) {
          tools::FillPayload(all[res->chunk_index(k)], layers, res->payload(k));
        }
        if (res->writable()) reservations.emplace_back(std::move(*res), all);
        if (reservations.size() > kMostHeld) {  // the oldest: finished and committed, or aborted
          auto& [old, old_keys] = reservations.front();
          if (step % 2 == 0) {
            for (size_t k = old.size() / 2; k < old.size(); ++k) {
              tools::FillPayload(old_keys[old.chunk_index(k)], layers, old.payload(k));
            }
            auto r = old.Commit();
            if (!r.ok()) api_error("Commit", r.status());
          } else {
            old.Abort();
          }
          reservations.pop_front();
        }
        break;
      }
      case 3: {  // prefetch it and keep the ticket
        PrefetchOptions po;
        po.deadline = std::chrono::milliseconds(600000);
        auto t = client.Prefetch(ns, doc, po);
        if (!t.ok()) {
          api_error("Prefetch", t.status());
          break;
        }
        if (t->id != 0) tickets.emplace_back(*t, doc);
        if (tickets.size() > kMostHeld) {  // the oldest is taken over by its load
          const auto& [ticket, tokens] = tickets.front();
          const std::vector<ChunkKey> tkeys = Client::ChunkKeys(ns, tokens);
          auto load = client.Load(ns, tokens, buffer, &ticket);
          if (load.ok())
            check.Check(tkeys, buffer, load->num_chunks);
          else
            api_error("Load", load.status());
          tickets.pop_front();
        }
        break;
      }
      case 4: {  // load it
        auto load = client.Load(ns, doc, buffer);
        if (load.ok())
          check.Check(keys, buffer, load->num_chunks);
        else
          api_error("Load", load.status());
        break;
      }
      default: {  // the scheduler's lookup
        auto r = client.Lookup(ns, doc);
        if (!r.ok()) api_error("Lookup", r.status());
        break;
      }
    }
    const nlohmann::json held = {{"leases", leases.size()},
                                 {"reservations", reservations.size()},
                                 {"tickets", tickets.size()},
                                 {"steps", step},
                                 {"bad_chunks", check.bad_chunks}};
    std::printf("HELD %s\n", held.dump().c_str());
    std::fflush(stdout);
  }
}

}  // namespace kvtier::testclient
