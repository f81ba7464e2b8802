// The control ring's shared pieces: the hostile-input decoder and the mapping checks.
#include "kvtier/control_ring.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

RingSubmission Lookup(uint32_t tokens, uint32_t request_id_bytes = 0) {
  RingSubmission e;
  e.seq = 9;
  e.op = static_cast<uint32_t>(RingOp::kLookup);
  e.token_count = tokens;
  e.request_id_bytes = request_id_bytes;
  std::memset(e.namespace_id, 0x42, sizeof(e.namespace_id));
  return e;
}

TEST(ControlRingUnitTest, DecodeCopiesTokensAndRequestIdOutOfTheSlot) {
  std::vector<uint8_t> data(64);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  RingSubmission lookup = Lookup(3, 5);
  lookup.first_chunk = 2;
  auto call = DecodeSubmission(lookup, data);
  ASSERT_TRUE(call.ok()) << call.status().ToString();
  EXPECT_EQ(call->seq, 9u);
  EXPECT_EQ(call->first_chunk, 2u);
  EXPECT_EQ(call->tokens, std::string(reinterpret_cast<const char*>(data.data()), 12));
  EXPECT_EQ(call->request_id, std::string(reinterpret_cast<const char*>(data.data()) + 12, 5));
  EXPECT_EQ(call->namespace_id, std::string(16, '\x42'));
  data[0] = 0xff;  // the client writes again: the call keeps what was copied
  EXPECT_EQ(static_cast<uint8_t>(call->tokens[0]), 0u);
}

TEST(ControlRingUnitTest, DecodeRefusesWhatDoesNotFitOrIsUnknown) {
  std::vector<uint8_t> data(64);
  EXPECT_TRUE(DecodeSubmission(Lookup(16), data).ok());      // exactly the area
  EXPECT_FALSE(DecodeSubmission(Lookup(16, 1), data).ok());  // one byte past it
  EXPECT_FALSE(DecodeSubmission(Lookup(17), data).ok());
  EXPECT_FALSE(
      DecodeSubmission(Lookup(uint32_t{1} << 30), data).ok());  // * 4 wraps to 0 in 32 bits
  EXPECT_FALSE(DecodeSubmission(Lookup(UINT32_MAX), data).ok());
  EXPECT_FALSE(
      DecodeSubmission(Lookup(0, kRingMaxRequestIdBytes + 1), std::vector<uint8_t>(1024)).ok());
  RingSubmission e = Lookup(1);
  e.flags = kRingAcquire | kRingAdoptTicket;
  e.prefetch_ticket = 9;
  auto adopt = DecodeSubmission(e, data);
  ASSERT_TRUE(adopt.ok()) << adopt.status().ToString();
  EXPECT_TRUE(adopt->adopt_ticket);
  EXPECT_EQ(adopt->prefetch_ticket, 9u);
  e.flags = 8;
  auto st = DecodeSubmission(e, data);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("flags"), std::string::npos) << st.status().message();
  e = Lookup(1);
  e.op = 7;
  st = DecodeSubmission(e, data);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("op 7"), std::string::npos) << st.status().message();
  e = Lookup(1);
  e.message_bytes = 4;  // a Lookup carries its tokens, not a message
  EXPECT_FALSE(DecodeSubmission(e, data).ok());
}

TEST(ControlRingUnitTest, OtherOpsCarryTheirMessageWithinTheSlot) {
  std::vector<uint8_t> data(64, 7);
  RingSubmission e;
  e.seq = 5;
  e.op = static_cast<uint32_t>(RingOp::kCommitWrite);
  e.message_bytes = 64;
  auto call = DecodeSubmission(e, data);
  ASSERT_TRUE(call.ok()) << call.status().ToString();
  EXPECT_EQ(call->op, RingOp::kCommitWrite);
  EXPECT_EQ(call->message, std::string(64, '\x07'));
  e.message_bytes = 65;
  EXPECT_FALSE(DecodeSubmission(e, data).ok());
  e.message_bytes = 8;
  e.token_count = 1;
  EXPECT_FALSE(DecodeSubmission(e, data).ok());
}

TEST(ControlRingUnitTest, AReleaseCarriesOnlyItsLease) {
  std::vector<uint8_t> data(64);
  RingSubmission e;
  e.seq = 4;
  e.op = static_cast<uint32_t>(RingOp::kReleaseRead);
  e.lease_id = 77;
  auto call = DecodeSubmission(e, data);
  ASSERT_TRUE(call.ok()) << call.status().ToString();
  EXPECT_EQ(call->op, RingOp::kReleaseRead);
  EXPECT_EQ(call->lease_id, 77u);
  EXPECT_EQ(call->seq, 4u);
  e.token_count = 1;
  EXPECT_FALSE(DecodeSubmission(e, data).ok());
  e.token_count = 0;
  e.flags = kRingAcquire;
  EXPECT_FALSE(DecodeSubmission(e, data).ok());
}

TEST(ControlRingUnitTest, AnAcquireAnswersAtMostWhatASlotHolds) {
  std::vector<uint8_t> data(64);
  RingSubmission e = Lookup(1);
  e.flags = kRingAcquire;
  EXPECT_EQ(DecodeSubmission(e, data)->max_chunks, kRingMaxLocations);  // 0: no limit, bounded
  e.max_chunks = kRingMaxLocations + 1;
  EXPECT_EQ(DecodeSubmission(e, data)->max_chunks, kRingMaxLocations);
  e.max_chunks = 7;
  EXPECT_EQ(DecodeSubmission(e, data)->max_chunks, 7u);
  e.flags = 0;
  e.max_chunks = 0;
  EXPECT_EQ(DecodeSubmission(e, data)->max_chunks, 0u);  // nothing to answer without acquire
}

TEST(ControlRingUnitTest, MapChecksSizeHeaderAndSession) {
  auto ring = RingMemory::Create(7);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  auto same = RingMemory::Map(dup(ring->fd()), 7);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  same->header().sq_tail.store(5);
  EXPECT_EQ(ring->header().sq_tail.load(), 5u) << "one memory, two mappings";
  auto other = RingMemory::Map(dup(ring->fd()), 8);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kDataLoss);
  ring->header().version = kRingVersion + 1;
  auto newer = RingMemory::Map(dup(ring->fd()), 7);
  ASSERT_FALSE(newer.ok());
  EXPECT_EQ(newer.status().code(), StatusCode::kDataLoss);
  const int small = memfd_create("not-a-ring", MFD_CLOEXEC);
  ASSERT_GE(small, 0);
  ASSERT_EQ(ftruncate(small, 4096), 0);
  auto tiny = RingMemory::Map(small, 7);
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("4096 bytes"), std::string::npos)
      << tiny.status().message();
}

// A client holds the ring's fd: had it shrunk the file, kvtierd's next touch
// of a page past the new end would have been a SIGBUS.
TEST(ControlRingUnitTest, AClientCannotResizeTheRingItWasHanded) {
  auto ring = RingMemory::Create(7);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  const int client_fd = dup(ring->fd());
  EXPECT_NE(ftruncate(client_fd, 0), 0) << "the ring shrank";
  EXPECT_NE(ftruncate(client_fd, 2 * kRingBytes), 0) << "the ring grew";
  close(client_fd);
  ring->header().sq_tail.store(1);  // still mapped and whole
  std::memset(ring->data(kRingDepth - 1).data(), 1, kRingSlotDataBytes);

  const int unsealed = memfd_create("unsealed-ring", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, static_cast<off_t>(kRingBytes)), 0);
  auto refused = RingMemory::Map(unsealed, 7);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("sealed"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace kvtier
