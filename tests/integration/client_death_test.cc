// The client-death loop (issue 10's campaign): clients (kvtier_test_client
// die) are killed with SIGKILL at random points of their lives, mostly while
// they hold leases, reservations with half-written payloads and prefetch
// tickets, eight at a time. Tickets live 10 minutes; leases and reservations
// too in one run (so only the end of each client's session can free them),
// 250 ms in the other (so many expire while their client lives: an expired
// reservation's slots wait for the session's end). Afterwards:
//   - no session, lease, reservation or ticket is left, no DRAM chunk is
//     pinned and no slot is in use without a committed chunk in it (the slots
//     in use are exactly the namespaces' chunks);
//   - a repeated replay's hit rate is what it was before the deaths;
//   - an eviction of everything keeps nothing (nothing is pinned anywhere).
// Deaths: $KVTIER_DEATHS (default 100, what `make test` runs; `make soak` runs 1,000).
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <random>
#include <thread>

#include "integration/campaign_util.h"

namespace kvtier::testing {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kAtOnce = 8;
constexpr int kLifeMinMs = 10;
constexpr int kLifeMaxMs = 600;

// What the dead clients held when they were killed, by their last HELD line.
struct DeathTally {
  uint64_t deaths = 0, before_first_step = 0, with_lease = 0, with_reservation = 0, with_ticket = 0,
           with_all_three = 0, bad_chunks = 0, api_errors = 0;
  uint64_t max_leases = 0, max_reservations = 0, max_prefetches = 0;  // seen in stats meanwhile
};

// The lease and reservation TTL of a run, in ms.
class ClientDeathTest : public ::testing::TestWithParam<int> {
 protected:
  DaemonProcess::Options Opts() {
    DaemonProcess::Options o;
    o.socket_path = dir_.Sub("kvtierd.sock");
    o.dram_bytes = "64MiB";
    o.extra_args = {"--nvme-path",          nvme_dir_.path(),
                    "--nvme-bytes",         "512MiB",
                    "--lease-ttl-ms",       std::to_string(GetParam()),
                    "--reservation-ttl-ms", std::to_string(GetParam())};
    o.log_path = dir_.Sub("kvtierd.log");
    return o;
  }

  // One replay of the built-in generator's first 50 requests (about 40 MiB of
  // chunks, well inside the 64 MiB arena: a repeat hits DRAM only).
  json Replay(const std::string& name) {
    const std::string out = dir_.Sub(name + ".json");
    CommandResult r =
        RunCommand({BinPath("kvtier-replay"), "--socket", dir_.Sub("kvtierd.sock"), "--generate",
                    "50", "--quiet", "--deadline-ms", "5000", "--json", out},
                   300s);
    EXPECT_TRUE(r.ok()) << r.Describe();
    json j = json::parse(ReadFileOrEmpty(out), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << name;
    if (!j.is_discarded()) {
      EXPECT_EQ(j["verify_errors"], 0u) << name;
    }
    return j;
  }

  // A dying client and when it dies.
  struct Slot {
    std::unique_ptr<ChildProcess> child;
    Clock::time_point kill_at;
    std::string out, err;
  };

  // Starts client number `i` in `slot`, to be killed 10-600 ms later.
  void Spawn(int i, std::mt19937_64& rng, Slot* slot) {
    slot->out = dir_.Sub("client" + std::to_string(i) + ".out");
    slot->err = dir_.Sub("client" + std::to_string(i) + ".err");
    std::error_code ec;
    std::filesystem::remove(slot->out, ec);
    std::filesystem::remove(slot->err, ec);
    slot->child = std::make_unique<ChildProcess>();
    std::string error;
    ASSERT_TRUE(slot->child->Spawn(
        {BinPath("kvtier_test_client"), "die", "--socket", dir_.Sub("kvtierd.sock"),
         "--chunk-tokens", "32", "--seed", std::to_string(rng())},
        slot->out, slot->err, &error))
        << error;
    slot->kill_at = Clock::now() + std::chrono::milliseconds(std::uniform_int_distribution<int>(
                                       kLifeMinMs, kLifeMaxMs)(rng));
  }

  // Kills the client in `slot` and adds what it held (its last HELD line) to *tally.
  static void Kill(Slot* slot, DeathTally* tally) {
    slot->child->Kill();
    slot->child.reset();
    ++tally->deaths;
    const std::string out = ReadFileOrEmpty(slot->out), err = ReadFileOrEmpty(slot->err);
    const json held = TaggedJson(out, "HELD ");
    if (held.is_null()) {
      ++tally->before_first_step;
    } else {
      const bool lease = held["leases"] > 0, reservation = held["reservations"] > 0,
                 ticket = held["tickets"] > 0;
      tally->with_lease += lease;
      tally->with_reservation += reservation;
      tally->with_ticket += ticket;
      tally->with_all_three += lease && reservation && ticket;
      tally->bad_chunks += held["bad_chunks"].get<uint64_t>();
    }
    if (err.find("API error") != std::string::npos) ++tally->api_errors;
    EXPECT_EQ(err.find("bytes differ"), std::string::npos) << err;
    EXPECT_EQ(err.find("API error"), std::string::npos) << err;
  }

  // Spawns `deaths` dying clients, kAtOnce at a time, and kills each at a
  // random point of its life; *tally gets what they held and what the daemon's
  // stats showed meanwhile.
  void KillClients(uint64_t deaths, std::mt19937_64& rng, const DaemonProcess& daemon,
                   DeathTally* tally) {
    std::vector<Slot> slots(kAtOnce);
    uint64_t spawned = 0;
    auto next_stats = Clock::now();
    while (tally->deaths < deaths) {
      for (int i = 0; i < kAtOnce; ++i) {
        if (slots[i].child && Clock::now() >= slots[i].kill_at) Kill(&slots[i], tally);
        if (!slots[i].child && spawned < deaths) {
          ASSERT_NO_FATAL_FAILURE(Spawn(i, rng, &slots[i]));
          ++spawned;
        }
      }
      if (Clock::now() >= next_stats) {  // what the living clients hold
        const json s = StatsOf(daemon);
        if (s.is_object()) {
          tally->max_leases = std::max<uint64_t>(tally->max_leases, s["active_leases"]);
          tally->max_reservations =
              std::max<uint64_t>(tally->max_reservations, s["active_reservations"]);
          tally->max_prefetches = std::max<uint64_t>(tally->max_prefetches, s["active_prefetches"]);
        }
        next_stats = Clock::now() + 200ms;
      }
      std::this_thread::sleep_for(2ms);
    }
  }

  // Waits until every session has ended, then checks that nothing is held and
  // no slot leaked; *stats gets the daemon's stats then.
  static void ExpectNothingHeld(const DaemonProcess& daemon, json* out) {
    json& stats = *out;
    // Every session ends when its stream breaks, and a promotion or prefetch
    // read a dead client started still finishes into its slots (uncommitted
    // until then): give the daemon a moment. A leak stays past it.
    for (auto until = Clock::now() + 10s; Clock::now() < until; std::this_thread::sleep_for(50ms)) {
      stats = StatsOf(daemon);
      if (stats.is_object() && stats["sessions"] == 0 &&
          TierOf(stats, "dram")["uncommitted_bytes"] == 0) {
        break;
      }
    }
    ASSERT_TRUE(stats.is_object());
    EXPECT_EQ(stats["sessions"], 0u);
    EXPECT_EQ(stats["active_leases"], 0u);
    EXPECT_EQ(stats["active_reservations"], 0u);
    EXPECT_EQ(stats["active_prefetches"], 0u);
    const json dram = TierOf(stats, "dram");
    EXPECT_EQ(dram["pinned_chunks"], 0u) << stats.dump();
    EXPECT_EQ(dram["uncommitted_bytes"], 0u) << "leaked slots: " << stats.dump();
    // The same from the namespaces' side: the slots in use are exactly their chunks.
    CommandResult ns = daemon.Ctl({"--json", "namespaces"});
    ASSERT_TRUE(ns.ok()) << ns.Describe();
    uint64_t chunk_bytes = 0;
    const json namespaces = json::parse(ns.out, nullptr, false);
    ASSERT_TRUE(namespaces.is_object()) << ns.out;
    for (const auto& n : namespaces["namespaces"]) {
      chunk_bytes += n["chunks"].get<uint64_t>() * n["slot_bytes"].get<uint64_t>();
    }
    EXPECT_EQ(dram["used_bytes"].get<uint64_t>(), chunk_bytes) << stats.dump() << ns.out;
  }

  TempDir dir_{"kvtier-client-death"};
  NvmeDir nvme_dir_{"client-death"};
};

TEST_P(ClientDeathTest, DeadClientsLeakNoSlotLeaseOrTicketAndTheHitRateHolds) {
  const uint64_t deaths = EnvCount("KVTIER_DEATHS", 100);
  const uint64_t seed = EnvCount("KVTIER_DEATH_SEED", std::random_device{}());
  std::printf("client death: %llu deaths, TTLs %d ms, KVTIER_DEATH_SEED=%llu\n",
              static_cast<unsigned long long>(deaths), GetParam(),
              static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");
  (void)Replay("warm-before");
  const json before = Replay("before");
  ASSERT_TRUE(before.is_object());

  DeathTally tally;
  const auto started = Clock::now();
  ASSERT_NO_FATAL_FAILURE(KillClients(deaths, rng, daemon, &tally));
  const double deaths_s = std::chrono::duration<double>(Clock::now() - started).count();
  ASSERT_TRUE(daemon.running()) << daemon.log();
  // The clients held things while alive, so what follows could have failed.
  EXPECT_GT(tally.with_lease, 0u);
  EXPECT_GT(tally.with_reservation, 0u);
  EXPECT_GT(tally.with_ticket, 0u);
  EXPECT_GT(tally.max_leases + tally.max_reservations + tally.max_prefetches, 0u);

  json stats;
  ASSERT_NO_FATAL_FAILURE(ExpectNothingHeld(daemon, &stats));
  const json dram = TierOf(stats, "dram");

  (void)Replay("warm-after");
  const json after = Replay("after");
  ASSERT_TRUE(after.is_object());
  EXPECT_EQ(after["hit_tokens"], before["hit_tokens"]);
  EXPECT_EQ(after["token_hit_rate"], before["token_hit_rate"]);
  EXPECT_EQ(after["fail_open"], 0u);

  // Nothing is pinned anywhere: evicting everything keeps nothing.
  CommandResult evict = daemon.Ctl({"--json", "evict", "--all"});
  ASSERT_TRUE(evict.ok()) << evict.Describe();
  const json evicted = json::parse(evict.out, nullptr, false);
  ASSERT_TRUE(evicted.is_object()) << evict.out;
  for (const auto& t : evicted["tiers"]) EXPECT_EQ(t["kept"], 0u) << evict.out;
  const json idle = TierOf(StatsOf(daemon), "dram");
  EXPECT_EQ(idle["used_bytes"], 0u) << idle.dump();

  const uint64_t leaked_slots = dram["uncommitted_bytes"].get<uint64_t>();
  ReportCampaign({{"campaign", "client_death"},
                  {"deaths", tally.deaths},
                  {"lease_and_reservation_ttl_ms", GetParam()},
                  {"seconds", deaths_s},
                  {"seed", seed},
                  {"died_before_first_step", tally.before_first_step},
                  {"died_holding_lease", tally.with_lease},
                  {"died_holding_reservation", tally.with_reservation},
                  {"died_holding_ticket", tally.with_ticket},
                  {"died_holding_all_three", tally.with_all_three},
                  {"max_active_leases", tally.max_leases},
                  {"max_active_reservations", tally.max_reservations},
                  {"max_active_prefetches", tally.max_prefetches},
                  {"leaked_uncommitted_bytes", leaked_slots},
                  {"pinned_chunks_after", dram["pinned_chunks"]},
                  {"leases_after", stats["active_leases"]},
                  {"reservations_after", stats["active_reservations"]},
                  {"tickets_after", stats["active_prefetches"]},
                  {"hit_rate_before", before["token_hit_rate"]},
                  {"hit_rate_after", after["token_hit_rate"]},
                  {"wrong_chunks", tally.bad_chunks},
                  {"api_errors", tally.api_errors}});
}

INSTANTIATE_TEST_SUITE_P(Ttls, ClientDeathTest, ::testing::Values(600000, 250),
                         [](const auto& info) { return "TtlMs" + std::to_string(info.param); });

}  // namespace
}  // namespace kvtier::testing
