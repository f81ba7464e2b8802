// Fuzz target: the control ring's decoder (kvtier/control_ring.h), which kvtierd runs on
// whatever a client left in its ring: DecodeSubmission over a submission entry made of raw bytes
// and a data area of fuzzed size (allocated exactly, so a read past it is an ASan report).
// Checks:
//   - an accepted ReleaseRead carries its lease and nothing else; ops 3-6 their message,
//     copied whole from inside the data area;
//   - an accepted Lookup has known flags whose tokens and request id lie inside
//     the data area, and the call holds exactly those bytes;
//   - with acquire, max_chunks is bounded by what a slot can answer (kRingMaxLocations);
//   - a refused entry breaks one of those rules.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <memory>

#include "fuzz_check.h"
#include "kvtier/control_ring.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;
  FuzzedDataProvider in(data, size);
  RingSubmission e;
  const auto raw = in.ConsumeBytes<uint8_t>(sizeof(e));
  if (!raw.empty()) std::memcpy(&e, raw.data(), raw.size());
  // Small counts often enough to be accepted, huge ones too.
  if (in.ConsumeBool()) e.token_count %= 1024;
  if (in.ConsumeBool()) e.request_id_bytes %= 300;
  if (in.ConsumeBool()) e.op = in.ConsumeIntegralInRange<uint32_t>(1, 6);
  if (in.ConsumeBool()) e.message_bytes %= 4096;
  const auto area = in.ConsumeRemainingBytes<uint8_t>();
  auto owned = std::make_unique<uint8_t[]>(area.size());
  if (!area.empty()) std::memcpy(owned.get(), area.data(), area.size());
  const std::span<const uint8_t> span(owned.get(), area.size());

  const bool fits = uint64_t{e.token_count} * 4 + e.request_id_bytes <= span.size();
  const bool lookup = e.op == static_cast<uint32_t>(RingOp::kLookup);
  const bool release = e.op == static_cast<uint32_t>(RingOp::kReleaseRead);
  const bool message_op = e.op >= 3 && e.op <= 6;
  const bool bare =
      e.flags == 0 && e.token_count == 0 && e.request_id_bytes == 0 && e.first_chunk == 0;
  const bool valid = lookup ? (e.flags & ~kRingKnownFlags) == 0 &&
                                  e.request_id_bytes <= kRingMaxRequestIdBytes && fits &&
                                  e.message_bytes == 0
                     : release    ? bare && e.message_bytes == 0
                     : message_op ? bare && e.message_bytes <= span.size()
                                  : false;
  auto call = DecodeSubmission(e, span);
  FUZZ_CHECK(call.ok() == valid, "accepted iff op, flags, request id and sizes are valid");
  if (!call.ok()) {
    FUZZ_CHECK(call.status().code() == StatusCode::kInvalidArgument,
               "refusals are INVALID_ARGUMENT");
    return 0;
  }
  FUZZ_CHECK(static_cast<uint32_t>(call->op) == e.op && call->seq == e.seq, "op and seq kept");
  if (release) {
    FUZZ_CHECK(call->lease_id == e.lease_id && call->tokens.empty() && call->message.empty(),
               "a release carries its lease");
    return 0;
  }
  if (message_op) {
    FUZZ_CHECK(call->message.size() == e.message_bytes &&
                   std::memcmp(call->message.data(), span.data(), call->message.size()) == 0,
               "the message is copied out whole");
    return 0;
  }
  FUZZ_CHECK(call->op == RingOp::kLookup, "a Lookup");
  FUZZ_CHECK(call->seq == e.seq, "seq echoed");
  FUZZ_CHECK(call->acquire == ((e.flags & kRingAcquire) != 0), "acquire flag");
  FUZZ_CHECK(call->hbm == ((e.flags & kRingHbm) != 0), "hbm flag");
  FUZZ_CHECK(call->tokens.size() == e.token_count * 4, "token bytes");
  FUZZ_CHECK(std::memcmp(call->tokens.data(), span.data(), call->tokens.size()) == 0,
             "tokens copied");
  FUZZ_CHECK(call->request_id.size() == e.request_id_bytes, "request id length");
  FUZZ_CHECK(std::memcmp(call->request_id.data(), span.data() + call->tokens.size(),
                         call->request_id.size()) == 0,
             "request id copied");
  FUZZ_CHECK(call->namespace_id.size() == 16 &&
                 std::memcmp(call->namespace_id.data(), e.namespace_id, 16) == 0,
             "namespace id copied");
  if (call->acquire) {
    FUZZ_CHECK(call->max_chunks >= 1 && call->max_chunks <= kRingMaxLocations,
               "an acquired answer fits a slot");
    FUZZ_CHECK(
        e.max_chunks == 0 || e.max_chunks > kRingMaxLocations || call->max_chunks == e.max_chunks,
        "a fitting max_chunks is kept");
  } else {
    FUZZ_CHECK(call->max_chunks == e.max_chunks, "max_chunks kept without acquire");
  }
  return 0;
}
