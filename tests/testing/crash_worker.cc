// kvtier_test_client crash-worker and read-back: the clients of the crash loop
// (tests/integration/crash_loop_test.cc).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_set>

#include "kvtier/admin_client.h"
#include "kvtier/tools/model_presets.h"
#include "testing/test_client_modes.h"

namespace kvtier::testclient {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Session {
  std::unique_ptr<Client> client;
  NamespaceHandle ns;
  uint32_t num_layers = 0;
};

// Connects and opens the model's namespace; nullopt (after saying why) when
// that fails.
std::optional<Session> Open(const Common& c, const char* name) {
  auto spec = tools::ModelPreset(c.model, c.chunk_tokens);
  if (!spec.ok()) {
    std::fprintf(stderr, "kvtier_test_client: %s\n", spec.status().ToString().c_str());
    return std::nullopt;
  }
  auto client = ConnectOrFail(c, name);
  if (!client.ok()) {
    std::fprintf(stderr, "kvtier_test_client: %s\n", client.status().ToString().c_str());
    return std::nullopt;
  }
  auto ns = (*client)->OpenNamespace(*spec);
  if (!ns.ok()) {
    std::fprintf(stderr, "kvtier_test_client: %s\n", ns.status().ToString().c_str());
    return std::nullopt;
  }
  return Session{std::move(*client), *ns, spec->num_layers};
}

// The daemon's DRAM row and lease count, for a diagnosis ("" when unknown).
std::string DramState(const std::string& socket) {
  auto admin = AdminClient::Connect(socket, std::chrono::milliseconds(2000));
  if (!admin.ok()) return "";
  auto stats = (*admin)->Stats();
  if (!stats.ok()) return "";
  for (const TierStats& t : stats->tiers) {
    if (t.name != "dram") continue;
    return "chunks " + std::to_string(t.chunks) + ", pinned " + std::to_string(t.pinned_chunks) +
           ", uncommitted bytes " + std::to_string(t.uncommitted_bytes) + ", active leases " +
           std::to_string(stats->active_leases);
  }
  return "";
}

// Prints `RESULT {json}` (`result` and the counts every mode has) and
// returns the exit code they make.
int Finish(json result, uint64_t fail_open, uint64_t api_errors, const PayloadCheck& check) {
  result["fail_open"] = fail_open;
  result["api_errors"] = api_errors;
  result["bad_chunks"] = check.bad_chunks;
  result["wrong_bytes"] = check.wrong_bytes;
  std::printf("RESULT %s\n", result.dump().c_str());
  std::fflush(stdout);
  if (check.bad_chunks != 0) return 3;
  return api_errors == 0 ? 0 : 1;
}

}  // namespace

int CrashWorker(const Common& c, const CrashWorkerOptions& o) {
  InstallStopHandler();
  std::optional<Session> s = Open(c, "kvtier_test_client crash-worker");
  if (!s) return 1;
  const uint64_t pb = s->ns.layout.payload_bytes;
  PayloadCheck check{s->num_layers, pb};
  std::vector<std::byte> buffer(Conversations::kMaxChunks * pb);
  uint64_t lookups = 0, loads = 0, prefetch_loads = 0, stores = 0, loaded_chunks = 0,
           stored_chunks = 0, fail_open = 0, api_errors = 0, turns_stored = 0;
  const auto until = Clock::now() + std::chrono::milliseconds(o.duration_ms);
  auto next_store = Clock::now();
  uint64_t rng = Mix(o.seed);
  auto api_error = [&](const char* what, const Status& st) {
    ++api_errors;
    std::fprintf(stderr, "kvtier_test_client: %s: %s\n", what, st.ToString().c_str());
  };
  while (!g_stop.load() && (o.duration_ms == 0 || Clock::now() < until)) {
    rng = Mix(rng);
    // Its own conversations grow in turn: turn t of conversation k is turn
    // number (t - 1) * conversations + k.
    const uint64_t own_turns = o.conversations * Conversations::kTurns;
    const bool grow = turns_stored < own_turns && Clock::now() >= next_store;
    uint64_t conv;
    uint32_t turn;
    if (grow) {
      conv = o.first_conversation + turns_stored % o.conversations;
      turn = static_cast<uint32_t>(1 + turns_stored / o.conversations);
    } else {
      const uint64_t started = std::min(turns_stored, o.conversations);
      conv = rng % (o.first_conversation + std::max<uint64_t>(started, 1));
      turn = 1 + static_cast<uint32_t>((rng >> 20) % Conversations::kTurns);
    }
    const std::vector<int32_t> tokens = Conversations::Prompt(conv, turn, c.chunk_tokens);
    const std::vector<ChunkKey> keys = Client::ChunkKeys(s->ns, tokens);
    const uint64_t kind = grow ? 2 : (rng >> 40) % 8;
    if (kind == 0) {  // the scheduler's lookup
      auto r = s->client->Lookup(s->ns, tokens);
      ++lookups;
      if (!r.ok())
        api_error("Lookup", r.status());
      else if (!r->fail_open.ok())
        ++fail_open;
      continue;
    }
    std::optional<PrefetchTicket> ticket;
    if (kind == 1) {  // prefetch on arrival, then the load waits for it
      PrefetchOptions po;
      po.policy = PrefetchPolicy::kWaitComplete;
      po.deadline = std::chrono::milliseconds(5000);
      auto t = s->client->Prefetch(s->ns, tokens, po);
      if (!t.ok())
        api_error("Prefetch", t.status());
      else if (!t->fail_open.ok())
        ++fail_open;
      else
        ticket = *t;
      ++prefetch_loads;
    }
    auto load = s->client->Load(s->ns, tokens, std::span(buffer).first(keys.size() * pb),
                                ticket ? &*ticket : nullptr);
    ++loads;
    if (!load.ok()) {
      api_error("Load", load.status());
      continue;
    }
    if (!load->fail_open.ok()) ++fail_open;
    check.Check(keys, buffer, load->num_chunks);
    loaded_chunks += load->num_chunks;
    if (!grow) continue;
    ++turns_stored;
    next_store = Clock::now() + std::chrono::milliseconds(o.store_interval_ms);
    if (load->num_chunks == keys.size()) continue;
    auto store =
        s->client->Store(s->ns, tokens, PatternWriter(keys, s->num_layers), load->num_chunks);
    ++stores;
    if (!store.ok())
      api_error("Store", store.status());
    else if (!store->fail_open.ok())
      ++fail_open;
    else
      stored_chunks += store->stored_chunks;
  }
  return Finish({{"lookups", lookups},
                 {"loads", loads},
                 {"prefetch_loads", prefetch_loads},
                 {"stores", stores},
                 {"turns_stored", turns_stored},
                 {"loaded_chunks", loaded_chunks},
                 {"stored_chunks", stored_chunks}},
                fail_open, api_errors, check);
}

int ReadBack(const Common& c, uint64_t conversations, const std::string& keys_out) {
  std::optional<Session> s = Open(c, "kvtier_test_client read-back");
  if (!s) return 1;
  const uint64_t pb = s->ns.layout.payload_bytes;
  PayloadCheck check{s->num_layers, pb};
  std::vector<std::byte> buffer(Conversations::kMaxChunks * pb);
  std::unordered_set<ChunkKey, ChunkKeyHash> served;
  uint64_t fail_open = 0, api_errors = 0, nvme_chunks = 0, short_loads = 0;
  for (uint64_t conv = 0; conv < conversations; ++conv) {
    const std::vector<int32_t> tokens =
        Conversations::Prompt(conv, Conversations::kTurns, c.chunk_tokens, /*with_tail=*/false);
    const std::vector<ChunkKey> keys = Client::ChunkKeys(s->ns, tokens);
    auto load = s->client->Load(s->ns, tokens, buffer);
    if (!load.ok()) {
      ++api_errors;
      std::fprintf(stderr, "kvtier_test_client: Load: %s\n", load.status().ToString().c_str());
      continue;
    }
    if (!load->fail_open.ok()) {
      ++fail_open;
      std::fprintf(stderr, "kvtier_test_client: Load failed open: %s\n",
                   load->fail_open.ToString().c_str());
    }
    nvme_chunks += load->nvme_chunks;
    const size_t good = check.Check(keys, buffer, load->num_chunks);
    served.insert(keys.begin(), keys.begin() + static_cast<ptrdiff_t>(good));
    // What a lookup says is cached (DRAM, then NVMe): the load got less?
    auto cached = s->client->Lookup(s->ns, tokens);
    if (cached.ok() && cached->fail_open.ok() && cached->num_chunks > load->num_chunks) {
      ++short_loads;
      std::fprintf(stderr,
                   "kvtier_test_client: conversation %llu: loaded %u chunks (%u from NVMe, "
                   "lookup %lld us), a lookup then found %u cached; DRAM then: %s\n",
                   static_cast<unsigned long long>(conv), load->num_chunks, load->nvme_chunks,
                   static_cast<long long>(load->lookup_time.count()), cached->num_chunks,
                   DramState(c.socket).c_str());
    }
  }
  if (!keys_out.empty()) {
    std::ofstream out(keys_out, std::ios::trunc);
    for (const ChunkKey& k : served) out << k.ToHex() << "\n";
    if (!out) {
      std::fprintf(stderr, "kvtier_test_client: cannot write %s\n", keys_out.c_str());
      return 2;
    }
  }
  return Finish({{"conversations", conversations},
                 {"served_chunks", served.size()},
                 {"nvme_chunks", nvme_chunks},
                 {"short_loads", short_loads}},
                fail_open, api_errors, check);
}

}  // namespace kvtier::testclient
