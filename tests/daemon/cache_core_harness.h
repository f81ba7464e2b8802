// CacheCoreDriver: a CacheCore on a small arena and a ManualClock, driven with
// proto requests the way a client drives it: payloads are written through a
// second mapping of the arena fd (as a client maps it), never through the core.
// CacheCoreHarness: the same as a gtest fixture, started with Options().
//
// Namespace: the tiny preset (test-model, fp16, mha, 2 layers, 1 KV head,
// head_dim 64, chunk_tokens 4): 2 KiB payload, 256 B header, 4 KiB slot.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/status_printer.h"
#include "kvtier/arena.h"
#include "kvtier/chunk_key.h"
#include "kvtier/daemon/cache_core.h"
#include "kvtier/daemon/core_wire.h"
#include "kvtier/namespace_spec.h"
#include "kvtier/slot_image.h"
#include "testing/manual_clock.h"

namespace kvtier::testing {

inline constexpr uint32_t kChunkTokens = 4;
inline constexpr uint64_t kSlotBytes = 4096;
inline constexpr uint64_t kHeaderBytes = 256;
inline constexpr uint64_t kPayloadBytes = 2048;

inline NamespaceSpec TinySpec() {
  NamespaceSpec s;
  s.model_id = "test-model";
  s.num_layers = 2;
  s.num_kv_heads = 1;
  s.head_dim = 64;
  s.chunk_tokens = kChunkTokens;
  return s;
}

// The pid of a process that has exited (a child run and reaped): for a
// session whose client is gone, so that ending it frees its reservations'
// slots at once (CacheCore::EndSession keeps them while the client runs).
inline uint32_t ExitedPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  if (child > 0) waitpid(child, &status, 0);
  return child > 0 ? static_cast<uint32_t>(child) : 0;
}

inline v1::NamespaceSpec TinyProtoSpec() {
  v1::NamespaceSpec p;
  p.set_model_id("test-model");
  p.set_kv_dtype("fp16");
  p.set_layout("mha");
  p.set_num_layers(2);
  p.set_num_kv_heads(1);
  p.set_head_dim(64);
  p.set_chunk_tokens(kChunkTokens);
  p.set_tp_size(1);
  return p;
}

// `n` token ids starting at `first` (distinct prompts use distinct ranges).
inline std::vector<int32_t> Tokens(size_t n, int32_t first = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Deterministic payload of the chunk named `key`.
inline std::vector<std::byte> PayloadFor(const ChunkKey& key) {
  std::vector<std::byte> p(kPayloadBytes);
  uint64_t x = key.lo ^ key.hi;
  for (auto& b : p) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    b = std::byte(static_cast<uint8_t>(x >> 56));
  }
  return p;
}

class CacheCoreDriver {
 public:
  // The arena holds `num_slots` tiny slots.
  static CacheCoreOptions Options(uint64_t num_slots = 16) {
    CacheCoreOptions o;
    o.dram_bytes = num_slots * kSlotBytes;
    o.lease_ttl = std::chrono::milliseconds(1000);
    o.reservation_ttl = std::chrono::milliseconds(2000);
    // One session may hold the whole arena here; cache_core_fairness_test
    // tests the default limit (half of it).
    o.session_max_bytes = o.dram_bytes;
    return o;
  }

  // `engine_keyed`: the namespace is engine-keyed (its chunks do not chain), with
  // chunk_tokens 8 and head_dim 32 so that the slot sizes stay the tiny ones.
  void Start(const CacheCoreOptions& options, std::unique_ptr<NvmeTier> nvme = nullptr,
             bool engine_keyed = false) {
    auto core = nvme ? CacheCore::Create(options, kEpoch, clock_, std::move(nvme))
                     : CacheCore::Create(options, kEpoch, clock_);
    ASSERT_TRUE(core.ok()) << core.status().ToString();
    core_ = std::move(core).value();
    auto mapped = Arena::Map(dup(core_->arena().fd()), core_->arena().bytes(), core_->epoch());
    ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
    client_arena_ = std::move(mapped).value();
    session_ = core_->OpenSession("test", ExitedPid());
    v1::OpenNamespaceRequest req;
    req.set_session_id(session_);
    *req.mutable_spec() = TinyProtoSpec();
    spec_ = TinySpec();
    if (engine_keyed) {
      req.mutable_spec()->set_engine_keyed(true);
      req.mutable_spec()->set_chunk_tokens(8);
      req.mutable_spec()->set_head_dim(32);
      spec_.engine_keyed = true;
      spec_.chunk_tokens = 8;
      spec_.head_dim = 32;
    }
    v1::OpenNamespaceResponse resp;
    const Status st = wire::Run(*core_, req, &resp);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ns_wire_ = resp.namespace_id();
    ns_ = spec_.Digest();
    ASSERT_EQ(ns_.ToBytes(), ns_wire_);
  }

  std::vector<ChunkKey> Keys(const std::vector<int32_t>& tokens) const {
    return spec_.ChunkKeys(ns_, tokens);
  }

  // Rewrites the slot of the chunk at `payload_offset` (through the client's
  // mapping) as if a prompt with `other_tokens` had been stored under the same
  // 128-bit key: a self-consistent header (valid checksums) that only the
  // token ids tell apart. The seam the collision tests force equal keys with.
  void ForgeCollision(uint64_t payload_offset, const ChunkKey& key, const ChunkKey& parent,
                      const std::vector<int32_t>& other_tokens) {
    std::byte* slot = client_arena_->base() + payload_offset - kHeaderBytes;
    SealSlot(slot, SlotLayout::For(spec_), {ns_, key, parent, other_tokens}, 12345);
  }

  v1::ReserveWriteRequest ReserveRequest(const std::vector<int32_t>& tokens, uint64_t session,
                                         size_t first_chunk = 0) const {
    v1::ReserveWriteRequest req;
    req.set_session_id(session);
    req.set_epoch(kEpoch);
    req.set_namespace_id(ns_wire_);
    const auto keys = Keys(tokens);
    const uint32_t ct = spec_.chunk_tokens;
    for (size_t i = first_chunk; i < keys.size(); ++i) {
      auto* c = req.add_chunks();
      c->set_key(keys[i].ToBytes());
      c->set_parent_key(spec_.ChunkParent(ns_, keys, i).ToBytes());
      c->set_tokens(PackTokens(std::span(tokens).subspan(i * ct, ct)));
    }
    return req;
  }

  v1::ReserveWriteResponse Reserve(const std::vector<int32_t>& tokens, uint64_t session = 0) {
    v1::ReserveWriteResponse resp;
    const Status st =
        wire::Run(*core_, ReserveRequest(tokens, session ? session : session_), &resp);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return resp;
  }

  // Writes each RESERVED chunk's payload through the client mapping.
  void WritePayloads(const std::vector<int32_t>& tokens, const v1::ReserveWriteResponse& resp) {
    const auto keys = Keys(tokens);
    int loc = 0;
    for (int i = 0; i < resp.outcomes_size(); ++i) {
      if (resp.outcomes(i) != v1::RESERVED) continue;
      const auto& where = resp.chunks(loc++);
      ASSERT_EQ(where.payload_bytes(), kPayloadBytes);
      ASSERT_TRUE(client_arena_->Contains(where.payload_offset(), where.payload_bytes()));
      const auto p = PayloadFor(keys[i]);
      std::memcpy(client_arena_->base() + where.payload_offset(), p.data(), p.size());
    }
  }

  Status Commit(uint64_t reservation_id, v1::CommitWriteResponse* resp = nullptr,
                uint64_t session = 0) {
    v1::CommitWriteRequest req;
    req.set_session_id(session ? session : session_);
    req.set_reservation_id(reservation_id);
    v1::CommitWriteResponse local;
    return wire::Run(*core_, req, resp ? resp : &local);
  }

  // Reserve, write, commit. Returns the number of committed chunks.
  uint32_t Store(const std::vector<int32_t>& tokens, uint64_t session = 0) {
    const v1::ReserveWriteResponse r = Reserve(tokens, session);
    WritePayloads(tokens, r);
    if (r.reservation_id() == 0) return 0;
    v1::CommitWriteResponse c;
    const Status st = Commit(r.reservation_id(), &c, session);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return c.committed_chunks();
  }

  // `hbm`: the caller reads HBM (LookupRequest.hbm).
  v1::LookupResponse Lookup(const std::vector<int32_t>& tokens, bool acquire, uint64_t session = 0,
                            bool hbm = false) {
    v1::LookupRequest req;
    req.set_session_id(session ? session : session_);
    req.set_epoch(kEpoch);
    req.set_namespace_id(ns_wire_);
    req.set_tokens(PackTokens(tokens));
    req.set_acquire(acquire);
    req.set_hbm(hbm);
    req.set_request_id(request_id);
    req.set_first_chunk(first_chunk);
    v1::LookupResponse resp;
    const Status st = wire::Run(*core_, req, &resp);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return resp;
  }

  Status Prefetch(const std::vector<int32_t>& tokens, v1::PrefetchResponse* resp,
                  uint64_t deadline_ms = 0, uint32_t max_chunks = 0, uint64_t session = 0,
                  bool to_hbm = false) {
    v1::PrefetchRequest req;
    req.set_session_id(session ? session : session_);
    req.set_epoch(kEpoch);
    req.set_namespace_id(ns_wire_);
    req.set_tokens(PackTokens(tokens));
    req.set_deadline_ms(deadline_ms);
    req.set_max_chunks(max_chunks);
    req.set_to_hbm(to_hbm);
    req.set_request_id(request_id);
    return wire::Run(*core_, req, resp);
  }

  Status PrefetchStatus(uint64_t ticket, v1::PrefetchStatusResponse* resp, uint64_t session = 0) {
    v1::PrefetchStatusRequest req;
    req.set_session_id(session ? session : session_);
    req.set_ticket(ticket);
    return wire::Run(*core_, req, resp);
  }

  // Polls until the prefetch is done (the I/O workers run in real time), for
  // at most 10 s.
  v1::PrefetchStatusResponse WaitPrefetchDone(uint64_t ticket) {
    v1::PrefetchStatusResponse s;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      const Status st = PrefetchStatus(ticket, &s);
      EXPECT_TRUE(st.ok()) << st.ToString();
      if (!st.ok() || s.done()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(s.done()) << "prefetch not done within 10 s";
    return s;
  }

  // `adopt`: the ticket is another session's (LookupRequest.adopt_ticket).
  v1::LookupResponse LookupWithTicket(const std::vector<int32_t>& tokens, uint64_t ticket,
                                      Status* status = nullptr, uint64_t session = 0,
                                      bool adopt = false) {
    v1::LookupRequest req;
    req.set_session_id(session ? session : session_);
    req.set_adopt_ticket(adopt);
    req.set_epoch(kEpoch);
    req.set_namespace_id(ns_wire_);
    req.set_tokens(PackTokens(tokens));
    req.set_acquire(true);
    req.set_prefetch_ticket(ticket);
    req.set_request_id(request_id);
    v1::LookupResponse resp;
    const Status st = wire::Run(*core_, req, &resp);
    if (status != nullptr) {
      *status = st;
    } else {
      EXPECT_TRUE(st.ok()) << st.ToString();
    }
    return resp;
  }

  Status Release(uint64_t lease_id, uint64_t session = 0) {
    v1::ReleaseReadRequest req;
    req.set_session_id(session ? session : session_);
    req.set_lease_id(lease_id);
    return wire::Run(*core_, req);
  }

  v1::StatsResponse Stats() const {
    v1::StatsResponse s;
    wire::Run(*core_, &s);
    s.clear_uptime_s();
    return s;
  }
  uint64_t UsedBytes() const { return Stats().tiers(0).used_bytes(); }

  // True when every leased location holds the payload of the matching chunk.
  bool LeasedBytesMatch(const std::vector<int32_t>& tokens, const v1::LookupResponse& resp) const {
    const auto keys = Keys(tokens);
    for (int i = 0; i < resp.chunks_size(); ++i) {
      const auto p = PayloadFor(keys[i]);
      if (std::memcmp(client_arena_->base() + resp.chunks(i).payload_offset(), p.data(),
                      p.size()) != 0) {
        return false;
      }
    }
    return true;
  }

  static constexpr uint64_t kEpoch = 0x5EED;
  std::string request_id;    // set on every Lookup and Prefetch: the engine request they belong to
  uint32_t first_chunk = 0;  // set on every Lookup: the chunks the engine holds already
  ManualClock clock_;
  std::unique_ptr<CacheCore> core_;
  std::unique_ptr<Arena> client_arena_;
  uint64_t session_ = 0;
  std::string ns_wire_;
  NamespaceId ns_;
  NamespaceSpec spec_;
};

class CacheCoreHarness : public ::testing::Test, public CacheCoreDriver {
 protected:
  void SetUp() override { Start(Options()); }
};

}  // namespace kvtier::testing
