// The client SDK when a lease or a reservation lapses under it, against a real
// kvtierd: a stalled reader or writer never gets, or makes, wrong bytes.
#include <chrono>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "testing/daemon_process.h"
#include "tiny_prompts.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using testing::kChunkTokens;
using testing::Payloads;
using testing::TempDir;
using testing::TinySpec;
using testing::Tokens;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A reader that stalls past its lease's TTL while another client reuses the
// slots must not be told the bytes it copied are valid (DESIGN.md failure
// model: never wrong bytes). Arena of exactly two slots, lease TTL 100 ms.
TEST(ClientLeaseLapse, CopyThatOutlivesItsLeaseIsReportedInvalidNotServed) {
  TempDir dir("kvtier-lapse");
  const NamespaceSpec spec = TinySpec();
  const uint64_t slot = SlotLayout::For(spec).slot_bytes;
  DaemonProcess::Options o;
  o.socket_path = dir.Sub("kvtierd.sock");
  o.dram_bytes = std::to_string(2 * slot);
  o.extra_args = {"--lease-ttl-ms", "100", "--session-max-bytes", o.dram_bytes};
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");
  ClientOptions co;
  co.socket_path = o.socket_path;
  co.deadline = 2000ms;
  auto a = Client::Connect(co);
  auto b = Client::Connect(co);
  ASSERT_TRUE(a.ok() && b.ok());
  auto ns_a = (*a)->OpenNamespace(spec);
  auto ns_b = (*b)->OpenNamespace(spec);
  ASSERT_TRUE(ns_a.ok() && ns_b.ok());

  const auto p = Tokens(1, 2 * kChunkTokens);
  const auto q = Tokens(2, 2 * kChunkTokens);
  auto stored = (*a)->Store(*ns_a, p, Payloads(*ns_a, p));
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->stored_chunks, 2u);

  uint32_t calls = 0;
  auto load = (*a)->Load(*ns_a, p, [&](size_t i, std::span<const std::byte>) {
    ++calls;
    if (i == 0) {
      std::this_thread::sleep_for(400ms);  // the lease (100 ms) lapses; the sweeper ends it
      auto q_stored = (*b)->Store(*ns_b, q, Payloads(*ns_b, q));  // evicts p, reuses its slots
      EXPECT_TRUE(q_stored.ok());
      EXPECT_EQ(q_stored->stored_chunks, 2u) << q_stored->fail_open.ToString();
    }
    return Status::Ok();
  });
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  EXPECT_EQ(calls, 2u);
  EXPECT_EQ(load->num_chunks, 0u) << "bytes of a reused slot were reported valid";
  EXPECT_EQ(load->fail_open.code(), StatusCode::kAborted) << load->fail_open.ToString();
  auto again = (*a)->Lookup(*ns_a, p);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->num_chunks, 0u);
}

// A writer that outlives its reservation's TTL must not be able to scribble
// over another client's chunk: the expired reservation cannot commit, and its
// slot is not handed to anyone while the writer's session lives.
TEST(ClientReservationLapse, LateWriterNeverCorruptsAnotherClientsChunk) {
  TempDir dir("kvtier-rlapse");
  const NamespaceSpec spec = TinySpec();
  const uint64_t slot = SlotLayout::For(spec).slot_bytes;
  DaemonProcess::Options o;
  o.socket_path = dir.Sub("kvtierd.sock");
  o.dram_bytes = std::to_string(slot);  // exactly one slot
  o.extra_args = {"--reservation-ttl-ms", "100"};
  DaemonProcess daemon(o);
  ASSERT_EQ(daemon.Start(), "");
  ClientOptions co;
  co.socket_path = o.socket_path;
  co.deadline = 2000ms;
  auto a = Client::Connect(co);
  auto b = Client::Connect(co);
  ASSERT_TRUE(a.ok() && b.ok());
  auto ns_a = (*a)->OpenNamespace(spec);
  auto ns_b = (*b)->OpenNamespace(spec);
  ASSERT_TRUE(ns_a.ok() && ns_b.ok());
  const auto p = Tokens(11, kChunkTokens);
  const auto q = Tokens(12, kChunkTokens);
  const auto q_bytes = Payloads(*ns_b, q);

  std::optional<Result<StoreResult>> b_store;
  auto a_store = (*a)->Store(*ns_a, p, [&](size_t, std::span<std::byte> payload) {
    std::this_thread::sleep_for(400ms);                 // the reservation (100 ms) lapses meanwhile
    b_store = (*b)->Store(*ns_b, q, q_bytes);           // wants the only slot
    std::memset(payload.data(), 0xAB, payload.size());  // the late write
    return Status::Ok();
  });
  ASSERT_TRUE(a_store.ok());
  EXPECT_EQ(a_store->stored_chunks, 0u) << "an expired reservation was committed";
  ASSERT_TRUE(b_store.has_value() && b_store->ok());
  EXPECT_EQ((*b_store)->stored_chunks, 0u) << "the slot went to B while A could still write it";

  // Whatever is cached now must be exactly what its writer stored.
  std::vector<std::byte> out(ns_b->layout.payload_bytes);
  auto load = (*b)->Load(*ns_b, q, out);
  ASSERT_TRUE(load.ok());
  if (load->num_chunks == 1) {
    EXPECT_EQ(std::memcmp(out.data(), q_bytes.data(), out.size()), 0);
  }
  (*a)->Close();  // A's session ends: its slot returns (the daemon sees it shortly)
  uint32_t stored = 0;
  for (auto until = Clock::now() + 5s; stored == 0 && Clock::now() < until;) {
    auto again = (*b)->Store(*ns_b, q, q_bytes);
    ASSERT_TRUE(again.ok());
    stored = again->stored_chunks;
    if (stored == 0) std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(stored, 1u);
  load = (*b)->Load(*ns_b, q, out);
  ASSERT_TRUE(load.ok());
  EXPECT_EQ(load->num_chunks, 1u);
  EXPECT_EQ(std::memcmp(out.data(), q_bytes.data(), out.size()), 0);
}

}  // namespace
}  // namespace kvtier
