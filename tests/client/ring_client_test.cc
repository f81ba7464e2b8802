// RingClient (client/src/ring_client.h) against a ring whose daemon end this
// test plays, so that it can stall an answer at any point: the client gives up
// at its deadline, and then the daemon's answer must be undone by someone.
#include "ring_client.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace kvtier::client_internal {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSession = 7;
constexpr uint64_t kLease = 4242;

// The daemon's end: waits for one submission and returns its slot and seq.
std::pair<uint32_t, uint32_t> TakeSubmission(RingMemory& ring, uint32_t head) {
  RingHeader& h = ring.header();
  while (h.sq_tail.load() == head) std::this_thread::sleep_for(100us);
  const uint32_t slot = h.sq[head % kRingDepth].load();
  return {slot, ring.slot(slot).submission.seq};
}

// Answers a Lookup with a lease, as kvtierd's RingServer does; returns whether
// the client still wanted the answer (false: the daemon must end the lease).
bool AnswerWithLease(RingMemory& ring, uint32_t slot, uint32_t seq,
                     std::chrono::milliseconds stall) {
  RingSlot& s = ring.slot(slot);
  RingCompletion c;
  c.seq = seq;
  c.num_chunks = 1;
  c.lease_id = kLease;
  std::memcpy(&s.completion, &c, sizeof(c));
  std::this_thread::sleep_for(stall);  // stopped before the one step that completes the call
  return RingComplete(s, seq);
}

struct Rings {
  RingMemory daemon;
  RingMemory client;
};

Rings MakeRings() {
  auto daemon = RingMemory::Create(kSession);
  EXPECT_TRUE(daemon.ok()) << daemon.status().ToString();
  auto client = RingMemory::Map(dup(daemon->fd()), kSession);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return {std::move(*daemon), std::move(*client)};
}

std::optional<Status> LookupOne(RingClient& client, std::chrono::milliseconds deadline,
                                v1::LookupResponse* resp) {
  static const NamespaceId ns{};
  static const std::vector<int32_t> tokens(16, 1);
  RingClient::LookupArgs args;
  args.ns = &ns;
  args.tokens = tokens;
  args.chunk_tokens = 16;
  args.acquire = true;
  return client.Lookup(
      args, Clock::now() + deadline, [] { return true; }, resp);
}

// A daemon stalled in the middle of its answer past the client's deadline:
// the client takes the lease exactly when the daemon was told it was wanted:
// else the daemon ends it (a lease nobody ends holds its slot until the TTL).
TEST(RingClientTest, AnAnswerStalledPastTheDeadlineIsEitherTakenOrUndone) {
  Rings rings = MakeRings();
  RingClient client(std::move(rings.client));
  std::atomic<bool> wanted{false};
  std::thread daemon([&] {
    auto [slot, seq] = TakeSubmission(rings.daemon, 0);
    std::this_thread::sleep_for(5ms);
    wanted = AnswerWithLease(rings.daemon, slot, seq, 300ms);
  });
  v1::LookupResponse resp;
  const auto start = Clock::now();
  const auto st = LookupOne(client, 20ms, &resp);
  const auto took = Clock::now() - start;
  daemon.join();
  ASSERT_TRUE(st.has_value());
  const bool taken = st->ok() && resp.lease_id() == kLease;
  EXPECT_EQ(taken, wanted.load()) << "client: " << st->ToString()
                                  << "; the daemon's answer was wanted: " << wanted.load();
  EXPECT_LT(took, 200ms) << "the client waited on a stalled daemon past its deadline";
}

// The daemon answers around the client's deadline, on either side of it, over
// and over: each answer is taken by the client or undone by the daemon, never
// both and never neither, and every slot comes back for later calls.
TEST(RingClientTest, AnswersRacingTheDeadlineAreTakenOrUndoneExactlyOnce) {
  Rings rings = MakeRings();
  RingClient client(std::move(rings.client));
  constexpr int kCalls = 300;
  std::vector<char> wanted(kCalls, 0);
  std::thread daemon([&] {
    for (int i = 0; i < kCalls; ++i) {
      auto [slot, seq] = TakeSubmission(rings.daemon, static_cast<uint32_t>(i));
      std::this_thread::sleep_for(std::chrono::microseconds((i * 37) % 4000));
      wanted[i] = AnswerWithLease(rings.daemon, slot, seq, 0ms) ? 1 : 0;
    }
  });
  std::vector<char> taken(kCalls, 0);
  for (int i = 0; i < kCalls; ++i) {
    v1::LookupResponse resp;
    std::optional<Status> st;
    // A slot given up on stays busy until its answer lands: wait for one to come back.
    for (const auto until = Clock::now() + 2s;
         !(st = LookupOne(client, 2ms, &resp)) && Clock::now() < until;) {
      std::this_thread::sleep_for(100us);
    }
    ASSERT_TRUE(st.has_value()) << "call " << i << ": no slot came back";
    if (!st->ok()) {
      EXPECT_EQ(st->code(), StatusCode::kDeadlineExceeded) << st->ToString();
    }
    taken[i] = st->ok() && resp.lease_id() == kLease ? 1 : 0;
  }
  daemon.join();
  int given_up = 0;
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_EQ(taken[i], wanted[i]) << "call " << i;
    given_up += taken[i] == 0;
  }
  // Both sides of the race were run.
  EXPECT_GT(given_up, 0);
  EXPECT_LT(given_up, kCalls);
}

}  // namespace
}  // namespace kvtier::client_internal
