#include "core_fuzz_driver.h"

#include <google/protobuf/stubs/logging.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "fuzz_check.h"
#include "kvtier/chunk_key.h"
#include "kvtier/daemon/core_wire.h"
#include "kvtier/proto/convert.h"
#include "kvtier/slot_image.h"

namespace kvtier::fuzz {
namespace {

constexpr uint64_t kBlock = kBlockBytes;

// Namespaces clients open: tiny (4 KiB slots), the same salted, MLA, a larger one (12 KiB
// slots), engine-keyed. Any other comes from raw bytes.
v1::NamespaceSpec Preset(uint32_t i) {
  v1::NamespaceSpec p;
  p.set_model_id("fuzz-model");
  p.set_kv_dtype("fp16");
  p.set_layout("mha");
  p.set_num_layers(2);
  p.set_num_kv_heads(1);
  p.set_head_dim(64);
  p.set_chunk_tokens(4);
  p.set_tp_size(1);
  switch (i) {
    case 1:
      p.set_cache_salt("tenant-b");
      break;
    case 2:
      p.set_layout("mla");
      p.set_num_kv_heads(0);
      p.set_head_dim(0);
      p.set_latent_dim(128);
      break;
    case 3:
      p.set_head_dim(128);
      p.set_chunk_tokens(8);
      break;
    case 4:
      p.set_engine_keyed(true);
      p.set_chunk_tokens(8);
      p.set_head_dim(32);
      break;
    default:
      break;
  }
  return p;
}

// The payload a client writes for chunk `key`: bytes of a generator seeded with the key.
std::vector<std::byte> PayloadFor(const ChunkKey& key, uint64_t bytes) {
  std::vector<std::byte> p(bytes);
  std::mt19937_64 bits(key.lo ^ (key.hi << 1));
  for (size_t i = 0; i < p.size(); i += 8) {
    const uint64_t word = bits();
    std::memcpy(p.data() + i, &word, std::min<size_t>(8, p.size() - i));
  }
  return p;
}

std::pair<uint64_t, uint64_t> Pair(const ChunkKey& k) { return {k.lo, k.hi}; }

}  // namespace

CoreFuzzDriver::CoreFuzzDriver(FuzzedDataProvider& in, bool nvme) : in_(in) {
  // Raw requests hold invalid UTF-8 in string fields; protobuf logs each parse it refuses.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  const uint8_t policy = in_.ConsumeIntegralInRange<uint8_t>(0, 2);
  options_.dram_bytes = kBlock * in_.ConsumeIntegralInRange<uint64_t>(2, 24);
  options_.lease_ttl = std::chrono::milliseconds(in_.ConsumeIntegralInRange(100, 2000));
  options_.reservation_ttl = std::chrono::milliseconds(in_.ConsumeIntegralInRange(100, 2000));
  options_.max_prompt_tokens = in_.ConsumeIntegralInRange<uint64_t>(8, 256);
  options_.max_chunks_per_request = in_.ConsumeIntegralInRange<uint32_t>(1, 16);
  options_.max_namespaces = in_.ConsumeIntegralInRange<uint32_t>(1, 3);
  options_.nvme_workers = 1;
  options_.selective_min_hits = in_.ConsumeIntegralInRange<uint32_t>(1, 3);
  options_.write_back_buffer_bytes = kBlock * in_.ConsumeIntegralInRange<uint64_t>(1, 8);
  if (nvme) {
    options_.nvme_write_policy = policy == 0   ? NvmeWritePolicy::kWriteThrough
                                 : policy == 1 ? NvmeWritePolicy::kWriteBack
                                               : NvmeWritePolicy::kSelective;
    disks_.push_back(std::make_shared<MemoryDisk>(kBlock * in_.ConsumeIntegralInRange(4, 32)));
    index_dir_ = std::make_unique<MemoryIndexDir>();
  }
  Start();
}

CoreFuzzDriver::~CoreFuzzDriver() {
  core_.reset();  // its NVMe tier closes the index before the directory goes
}

void CoreFuzzDriver::Start() {
  std::unique_ptr<NvmeTier> nvme;
  devices_.clear();
  if (index_dir_) {
    std::vector<std::unique_ptr<BlockDevice>> devices;
    for (const auto& disk : disks_) {
      auto d = std::make_unique<MemoryBlockDevice>(disk);
      devices_.push_back(d.get());
      devices.push_back(std::move(d));
    }
    auto index = index_dir_->Open();
    FUZZ_CHECK(index.ok(), "the in-memory NVMe index does not open");
    auto tier = NvmeTier::Create(std::move(devices), std::move(*index));
    FUZZ_CHECK(tier.ok(), "the NVMe tier does not open over what a core wrote");
    nvme = std::move(*tier);
  }
  auto core = CacheCore::Create(options_, epoch_, clock_, std::move(nvme));
  FUZZ_CHECK(core.ok(), "the core does not start");
  core_ = std::move(*core);
  auto mapped = Arena::Map(dup(core_->arena().fd()), core_->arena().bytes(), epoch_);
  FUZZ_CHECK(mapped.ok(), "the client cannot map the arena");
  client_arena_ = std::move(*mapped);
}

void CoreFuzzDriver::Commit() { EndReservation(/*commit=*/true); }
void CoreFuzzDriver::Abort() { EndReservation(/*commit=*/false); }

void CoreFuzzDriver::Restart() {
  if (restarted_) return;
  restarted_ = true;
  client_arena_.reset();
  core_.reset();
  ++epoch_;
  for (uint64_t s : sessions_) ended_sessions_.push_back(s);
  sessions_.clear();
  namespaces_.clear();
  leases_.clear();
  reservations_.clear();
  tickets_.clear();
  Start();
}

bool CoreFuzzDriver::Step() {
  if (in_.remaining_bytes() == 0) return false;
  ++calls_;
  // Ops weighted as a client's mix; a restart (reopening the NVMe index, the slowest op)
  // at most once an input.
  static constexpr void (CoreFuzzDriver::*kOps[])() = {
      &CoreFuzzDriver::Lookup,        &CoreFuzzDriver::Lookup,
      &CoreFuzzDriver::Lookup,        &CoreFuzzDriver::Lookup,
      &CoreFuzzDriver::Lookup,        &CoreFuzzDriver::Reserve,
      &CoreFuzzDriver::Reserve,       &CoreFuzzDriver::Reserve,
      &CoreFuzzDriver::Reserve,       &CoreFuzzDriver::Commit,
      &CoreFuzzDriver::Commit,        &CoreFuzzDriver::Commit,
      &CoreFuzzDriver::Abort,         &CoreFuzzDriver::Release,
      &CoreFuzzDriver::Release,       &CoreFuzzDriver::Prefetch,
      &CoreFuzzDriver::Prefetch,      &CoreFuzzDriver::PrefetchStatus,
      &CoreFuzzDriver::OpenSession,   &CoreFuzzDriver::OpenSession,
      &CoreFuzzDriver::EndSession,    &CoreFuzzDriver::OpenNamespace,
      &CoreFuzzDriver::OpenNamespace, &CoreFuzzDriver::Evict,
      &CoreFuzzDriver::AdvanceClock,  &CoreFuzzDriver::AdvanceClock,
      &CoreFuzzDriver::WriteNvme,     &CoreFuzzDriver::WriteNvme,
      &CoreFuzzDriver::WriteNvme,     &CoreFuzzDriver::DamageNvme,
      &CoreFuzzDriver::Scribble,      &CoreFuzzDriver::Restart,
  };
  static_assert(std::size(kOps) == 32);
  (this->*kOps[in_.ConsumeIntegralInRange<size_t>(0, std::size(kOps) - 1)])();
  CheckStats();
  return true;
}

template <typename Message>
void CoreFuzzDriver::ParseRaw(Message* m) {
  const std::string raw = in_.ConsumeRandomLengthString(96);
  if (!m->ParseFromString(raw)) m->Clear();
}

uint64_t CoreFuzzDriver::PickSession(bool keep_raw, uint64_t raw) {
  if (keep_raw) {
    // Mostly the raw id; sometimes one that ended.
    if (!ended_sessions_.empty() && raw % 2 == 0) {
      return ended_sessions_[raw / 2 % ended_sessions_.size()];
    }
    return raw;
  }
  if (sessions_.empty()) return 0;
  return sessions_[in_.ConsumeIntegralInRange<size_t>(0, sessions_.size() - 1)];
}

const CoreFuzzDriver::Ns* CoreFuzzDriver::PickNs() {
  if (namespaces_.empty()) return nullptr;
  return &namespaces_[in_.ConsumeIntegralInRange<size_t>(0, namespaces_.size() - 1)];
}

std::vector<int32_t> CoreFuzzDriver::Prompt(const Ns& ns) {
  const uint32_t ct = ns.spec.chunk_tokens;
  std::vector<int32_t> tokens;
  const int blocks = in_.ConsumeIntegralInRange(0, 6);
  for (int b = 0; b < blocks; ++b) {
    const int32_t id = in_.ConsumeIntegralInRange(0, 3);
    for (uint32_t j = 0; j < ct; ++j) tokens.push_back(id * 1000 + static_cast<int32_t>(j));
  }
  const uint32_t tail = in_.ConsumeIntegralInRange<uint32_t>(0, ct - 1);
  tokens.insert(tokens.end(), tail, 7);
  return tokens;
}

uint64_t CoreFuzzDriver::PickId(const std::vector<Held>& from, bool keep_raw, uint64_t raw) {
  if (keep_raw) {
    if (!used_ids_.empty() && raw % 2 == 0) return used_ids_[raw / 2 % used_ids_.size()];
    return raw;
  }
  if (from.empty()) return used_ids_.empty() ? 0 : used_ids_.back();
  return from[in_.ConsumeIntegralInRange<size_t>(0, from.size() - 1)].id;
}

std::string CoreFuzzDriver::Snapshot() {
  v1::StatsResponse s;
  wire::Run(*core_, &s);
  s.clear_uptime_s();
  v1::NamespacesResponse n;
  wire::Run(*core_, &n);
  return s.SerializeAsString() + "|" + n.SerializeAsString();
}

void CoreFuzzDriver::CheckRejected(const Status& st, const std::string& before, const char* call) {
  if (st.ok()) return;
  FUZZ_CHECK(!st.message().empty(), call);
  FUZZ_CHECK(Snapshot() == before, call);
}

void CoreFuzzDriver::OpenSession() {
  const uint64_t id =
      core_->OpenSession(in_.ConsumeRandomLengthString(32), in_.ConsumeIntegral<uint32_t>());
  FUZZ_CHECK(
      std::find(sessions_.begin(), sessions_.end(), id) == sessions_.end() &&
          std::find(ended_sessions_.begin(), ended_sessions_.end(), id) == ended_sessions_.end(),
      "a session id was handed out twice");
  sessions_.push_back(id);
}

bool CoreFuzzDriver::Take(std::vector<Held>& held, uint64_t id, uint64_t session) {
  return std::erase_if(held, [&](const Held& h) { return h.id == id && h.session == session; }) > 0;
}

void CoreFuzzDriver::DropSession(uint64_t session) {
  for (auto* held : {&leases_, &reservations_, &tickets_}) {
    std::erase_if(*held, [&](const Held& h) { return h.session == session; });
  }
}

void CoreFuzzDriver::EndSession() {
  const uint64_t s = PickSession(in_.ConsumeBool(), in_.ConsumeIntegral<uint64_t>());
  core_->EndSession(s);
  if (std::erase(sessions_, s) > 0) {
    ended_sessions_.push_back(s);
    DropSession(s);
  }
}

void CoreFuzzDriver::OpenNamespace() {
  v1::OpenNamespaceRequest req;
  ParseRaw(&req);
  const uint8_t mask = in_.ConsumeIntegral<uint8_t>();
  req.set_session_id(PickSession(mask & 1, req.session_id()));
  if ((mask & 2) == 0) *req.mutable_spec() = Preset(in_.ConsumeIntegralInRange(0, 4));
  const std::string before = Snapshot();
  v1::OpenNamespaceResponse resp;
  const Status st = wire::Run(*core_, req, &resp);
  CheckRejected(st, before, "a rejected OpenNamespace changed the core");
  if (!st.ok()) return;
  Ns ns;
  ns.spec = FromProto(req.spec());
  FUZZ_CHECK(ns.spec.Validate().ok(), "OpenNamespace accepted an invalid spec");
  ns.id = ns.spec.Digest();
  ns.layout = SlotLayout::For(ns.spec);
  ns.wire = ns.id.ToBytes();
  FUZZ_CHECK(resp.namespace_id() == ns.wire && resp.payload_bytes() == ns.layout.payload_bytes &&
                 resp.header_bytes() == ns.layout.header_bytes &&
                 resp.slot_bytes() == ns.layout.slot_bytes &&
                 ns.layout.slot_bytes <= options_.dram_bytes,
             "OpenNamespace answered another layout");
  std::erase_if(namespaces_, [&](const Ns& n) { return n.wire == ns.wire; });
  namespaces_.push_back(std::move(ns));
}

void CoreFuzzDriver::CheckLease(const Ns& ns, const std::vector<int32_t>& tokens,
                                const v1::LookupResponse& resp, bool acquire, uint32_t max_chunks) {
  const std::vector<ChunkKey> keys = ns.spec.ChunkKeys(ns.id, tokens);
  const uint32_t n = resp.num_chunks();
  FUZZ_CHECK(n <= keys.size() && (max_chunks == 0 || n <= max_chunks),
             "a lookup hit more chunks than it asked for");
  FUZZ_CHECK(resp.cached_tokens() == uint64_t{n} * ns.spec.chunk_tokens &&
                 resp.nvme_chunks() <= n && resp.prefetched_chunks() <= n,
             "a lookup's counts are inconsistent");
  if (!acquire) {
    FUZZ_CHECK(resp.chunks_size() == 0 && resp.lease_id() == 0, "a plain lookup leased");
    return;
  }
  FUZZ_CHECK(resp.chunks_size() == static_cast<int>(n) && (resp.lease_id() != 0) == (n > 0),
             "a leased lookup has not one location per chunk");
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> offsets;  // payload offset -> key
  const uint32_t ct = ns.spec.chunk_tokens;
  for (uint32_t i = 0; i < n; ++i) {
    const v1::ChunkLocation& loc = resp.chunks(static_cast<int>(i));
    FUZZ_CHECK(loc.payload_bytes() == ns.layout.payload_bytes &&
                   loc.payload_offset() >= ns.layout.header_bytes &&
                   (loc.payload_offset() - ns.layout.header_bytes) % kBlock == 0 &&
                   client_arena_->Contains(loc.payload_offset(), loc.payload_bytes()),
               "a leased location is not a slot of the arena");
    // Engine-keyed prompts can hold one page twice (equal keys): one slot, leased twice.
    const auto [slot_key, fresh] = offsets.emplace(loc.payload_offset(), Pair(keys[i]));
    FUZZ_CHECK(fresh || slot_key->second == Pair(keys[i]), "two leased chunks share a slot");
    if (scribbled_) continue;  // the client wrote over slots: its results are its own
    const std::byte* slot = client_arena_->base() + loc.payload_offset() - ns.layout.header_bytes;
    const SlotIdentity id{ns.id, keys[i], ns.spec.ChunkParent(ns.id, keys, i),
                          std::span(tokens).subspan(i * ct, ct)};
    FUZZ_CHECK(VerifySlotHeader(slot, ns.layout, id, false).ok(),
               "a leased slot holds another chunk (token check)");
    FUZZ_CHECK(loc.sequence() != 0 && SlotSequence(slot) == loc.sequence(),
               "a leased slot's sequence is not the one handed out");
    if (unwritten_.count(Pair(keys[i])) != 0) continue;
    const std::vector<std::byte> want = PayloadFor(keys[i], ns.layout.payload_bytes);
    FUZZ_CHECK(
        std::memcmp(client_arena_->base() + loc.payload_offset(), want.data(), want.size()) == 0,
        "a leased chunk's payload is not what was stored");
  }
}

void CoreFuzzDriver::Lookup() {
  v1::LookupRequest req;
  ParseRaw(&req);
  const uint8_t mask = in_.ConsumeIntegral<uint8_t>();
  req.set_session_id(PickSession(mask & 1, req.session_id()));
  if ((mask & 2) == 0) req.set_epoch(epoch_);
  const Ns* ns = (mask & 4) == 0 ? PickNs() : nullptr;
  std::vector<int32_t> tokens;
  if (ns != nullptr) {
    req.set_namespace_id(ns->wire);
    if ((mask & 8) == 0) {
      tokens = Prompt(*ns);
      req.set_tokens(PackTokens(tokens));
    }
  }
  if ((mask & 16) == 0) {  // no ticket, or one of the live ones
    const bool use = !tickets_.empty() && in_.ConsumeBool();
    req.set_prefetch_ticket(use ? PickId(tickets_, false, 0) : 0);
  }
  if ((mask & 64) == 0) {
    req.set_acquire(in_.ConsumeBool());
    req.set_max_chunks(in_.ConsumeIntegralInRange(0, 3));
    req.set_hbm(false);
  }
  const std::string before = Snapshot();
  v1::LookupResponse resp;
  const Status st = wire::Run(*core_, req, &resp);
  CheckRejected(st, before, "a rejected Lookup changed the core");
  if (!st.ok()) return;
  if (req.prefetch_ticket() != 0) Take(tickets_, req.prefetch_ticket(), req.session_id());
  if (resp.lease_id() != 0) {
    leases_.push_back({req.session_id(), resp.lease_id(), clock_.Now() + options_.lease_ttl});
    used_ids_.push_back(resp.lease_id());
  }
  // A request whose namespace and tokens were well-formed can be checked chunk by chunk.
  if (ns != nullptr && (mask & 8) == 0) {
    CheckLease(*ns, tokens, resp, req.acquire(), req.max_chunks());
  }
}

void CoreFuzzDriver::Prefetch() {
  v1::PrefetchRequest req;
  ParseRaw(&req);
  const uint8_t mask = in_.ConsumeIntegral<uint8_t>();
  req.set_session_id(PickSession(mask & 1, req.session_id()));
  if ((mask & 2) == 0) req.set_epoch(epoch_);
  if (const Ns* ns = (mask & 4) == 0 ? PickNs() : nullptr; ns != nullptr) {
    req.set_namespace_id(ns->wire);
    if ((mask & 8) == 0) req.set_tokens(PackTokens(Prompt(*ns)));
  }
  if ((mask & 16) == 0) {
    req.set_deadline_ms(in_.ConsumeIntegralInRange<uint64_t>(0, 5000));
    req.set_max_chunks(in_.ConsumeIntegralInRange(0, 3));
    req.set_to_hbm(false);
  }
  const std::string before = Snapshot();
  v1::PrefetchResponse resp;
  const Status st = wire::Run(*core_, req, &resp);
  CheckRejected(st, before, "a rejected Prefetch changed the core");
  if (!st.ok()) return;
  FUZZ_CHECK(resp.ready_chunks() <= resp.total_chunks() &&
                 resp.nvme_chunks() <= resp.total_chunks() &&
                 (resp.ticket() != 0) == (resp.total_chunks() > 0),
             "a prefetch's counts are inconsistent");
  if (resp.ticket() == 0) return;
  const uint64_t deadline = req.deadline_ms() == 0 ? 10'000 : req.deadline_ms();
  tickets_.push_back(
      {req.session_id(), resp.ticket(), clock_.Now() + std::chrono::milliseconds(deadline)});
  used_ids_.push_back(resp.ticket());
  // Wait for its promotion, so that the core is quiescent for the checks.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  v1::PrefetchStatusRequest sreq;
  sreq.set_session_id(req.session_id());
  sreq.set_ticket(resp.ticket());
  for (;;) {
    v1::PrefetchStatusResponse s;
    FUZZ_CHECK(wire::Run(*core_, sreq, &s).ok(), "a fresh ticket has no status");
    FUZZ_CHECK(s.total_chunks() == resp.total_chunks() && s.ready_chunks() <= s.total_chunks(),
               "a ticket's status is inconsistent");
    if (s.done()) break;
    FUZZ_CHECK(std::chrono::steady_clock::now() < until, "a prefetch did not finish in 10 s");
    std::this_thread::yield();
  }
}

void CoreFuzzDriver::PrefetchStatus() {
  v1::PrefetchStatusRequest req;
  ParseRaw(&req);
  const uint8_t mask = in_.ConsumeIntegral<uint8_t>();
  req.set_session_id(PickSession(mask & 1, req.session_id()));
  req.set_ticket(PickId(tickets_, mask & 2, req.ticket()));
  const std::string before = Snapshot();
  v1::PrefetchStatusResponse resp;
  const Status st = wire::Run(*core_, req, &resp);
  FUZZ_CHECK(Snapshot() == before, "PrefetchStatus changed the core");
  const bool owned = std::any_of(tickets_.begin(), tickets_.end(), [&](const Held& h) {
    return h.id == req.ticket() && h.session == req.session_id();
  });
  FUZZ_CHECK(st.ok() == owned, "PrefetchStatus disagrees with the tickets handed out");
}

void CoreFuzzDriver::Release() {
  v1::ReleaseReadRequest req;
  ParseRaw(&req);
  const uint8_t mask = in_.ConsumeIntegral<uint8_t>();
  req.set_session_id(PickSession(mask & 1, req.session_id()));
  req.set_lease_id(PickId(leases_, mask & 2, req.lease_id()));
  const std::string before = Snapshot();
  const Status st = wire::Run(*core_, req);
  CheckRejected(st, before, "a rejected ReleaseRead changed the core");
  FUZZ_CHECK(st.ok() == Take(leases_, req.lease_id(), req.session_id()),
             "ReleaseRead disagrees with the leases handed out");
}

void CoreFuzzDriver::Reserve() {
  v1::ReserveWriteRequest req;
  ParseRaw(&req);
  const uint8_t mask = in_.ConsumeIntegral<uint8_t>();
  req.set_session_id(PickSession(mask & 1, req.session_id()));
  if ((mask & 2) == 0) req.set_epoch(epoch_);
  const Ns* ns = (mask & 4) == 0 ? PickNs() : nullptr;
  std::vector<ChunkKey> keys;
  size_t first = 0;
  if (ns != nullptr) {
    req.set_namespace_id(ns->wire);
    if ((mask & 8) == 0) {
      const std::vector<int32_t> tokens = Prompt(*ns);
      keys = ns->spec.ChunkKeys(ns->id, tokens);
      first = in_.ConsumeIntegralInRange<size_t>(0, keys.size());
      const uint32_t ct = ns->spec.chunk_tokens;
      req.clear_chunks();
      for (size_t i = first; i < keys.size(); ++i) {
        v1::ChunkToWrite* c = req.add_chunks();
        c->set_key(keys[i].ToBytes());
        c->set_parent_key(ns->spec.ChunkParent(ns->id, keys, i).ToBytes());
        c->set_tokens(PackTokens(std::span(tokens).subspan(i * ct, ct)));
      }
      if ((mask & 16) != 0 && req.chunks_size() > 0) {  // one field of one chunk goes wrong
        v1::ChunkToWrite* c =
            req.mutable_chunks(in_.ConsumeIntegralInRange(0, req.chunks_size() - 1));
        std::string* field = in_.ConsumeBool() ? c->mutable_key() : c->mutable_tokens();
        if (in_.ConsumeBool())
          field->pop_back();
        else
          (*field)[0] ^= 1;
        keys.clear();  // no longer the prompt's
      }
    }
  }
  const std::string before = Snapshot();
  v1::ReserveWriteResponse resp;
  const Status st = wire::Run(*core_, req, &resp);
  CheckRejected(st, before, "a rejected ReserveWrite changed the core");
  if (!st.ok()) return;
  FUZZ_CHECK(resp.outcomes_size() == req.chunks_size(), "not one outcome per chunk");
  const auto reserved =
      static_cast<int>(std::count(resp.outcomes().begin(), resp.outcomes().end(), v1::RESERVED));
  FUZZ_CHECK(resp.chunks_size() == reserved && (resp.reservation_id() != 0) == (reserved > 0),
             "not one location per reserved chunk");
  const bool write = (mask & 32) == 0;
  int loc = 0;
  for (int i = 0; i < resp.outcomes_size(); ++i) {
    if (resp.outcomes(i) != v1::RESERVED) continue;
    const v1::ChunkLocation& where = resp.chunks(loc++);
    const ChunkKey key = *ChunkKey::FromWire(req.chunks(i).key());
    const SlotLayout layout =
        ns != nullptr && ns->wire == req.namespace_id() ? ns->layout : SlotLayout{};
    FUZZ_CHECK(client_arena_->Contains(where.payload_offset(), where.payload_bytes()),
               "a reserved location is outside the arena");
    if (!write || layout.payload_bytes != where.payload_bytes()) {
      unwritten_.insert(Pair(key));
      continue;
    }
    const std::vector<std::byte> p = PayloadFor(key, layout.payload_bytes);
    std::memcpy(client_arena_->base() + where.payload_offset(), p.data(), p.size());
  }
  if (resp.reservation_id() != 0) {
    reservations_.push_back(
        {req.session_id(), resp.reservation_id(), clock_.Now() + options_.reservation_ttl});
    used_ids_.push_back(resp.reservation_id());
  }
}

void CoreFuzzDriver::EndReservation(bool commit) {
  v1::CommitWriteRequest req;  // AbortWriteRequest has the same fields
  ParseRaw(&req);
  const uint8_t mask = in_.ConsumeIntegral<uint8_t>();
  req.set_session_id(PickSession(mask & 1, req.session_id()));
  req.set_reservation_id(PickId(reservations_, mask & 2, req.reservation_id()));
  const std::string before = Snapshot();
  Status st;
  if (commit) {
    v1::CommitWriteResponse resp;
    st = wire::Run(*core_, req, &resp);
  } else {
    v1::AbortWriteRequest abort;
    abort.set_session_id(req.session_id());
    abort.set_reservation_id(req.reservation_id());
    st = wire::Run(*core_, abort);
  }
  CheckRejected(st, before, "a rejected CommitWrite or AbortWrite changed the core");
  FUZZ_CHECK(st.ok() == Take(reservations_, req.reservation_id(), req.session_id()),
             "CommitWrite or AbortWrite disagrees with the reservations handed out");
}

void CoreFuzzDriver::Evict() {
  v1::EvictRequest req;
  ParseRaw(&req);
  const uint8_t mask = in_.ConsumeIntegral<uint8_t>();
  if ((mask & 1) == 0) {
    const Ns* ns = PickNs();
    const uint8_t scope = in_.ConsumeIntegralInRange(0, 2);
    req.set_all(scope == 0 || ns == nullptr);
    req.clear_namespace_id();
    req.clear_tokens();
    if (!req.all()) req.set_namespace_id(ns->wire);
    if (!req.all() && scope == 2) req.set_tokens(PackTokens(Prompt(*ns)));
  }
  const std::string before = Snapshot();
  v1::EvictResponse resp;
  const Status st = wire::Run(*core_, req, &resp);
  CheckRejected(st, before, "a rejected Evict changed the core");
}

void CoreFuzzDriver::Expire(std::vector<Held>& held) {
  const Clock::TimePoint now = clock_.Now();
  std::erase_if(held, [&](const Held& h) { return h.expiry <= now; });
}

void CoreFuzzDriver::AdvanceClock() {
  clock_.Advance(std::chrono::milliseconds(in_.ConsumeIntegralInRange(0, 3000)));
  core_->ExpireNow();
  for (auto* held : {&leases_, &reservations_, &tickets_}) Expire(*held);
}

void CoreFuzzDriver::WriteNvme() {
  if (in_.ConsumeBool()) {
    core_->FlushWriteBack();
    return;
  }
  for (int i = 0; i < 64 && core_->DestageOnce() > 0; ++i) {
  }
}

void CoreFuzzDriver::DamageNvme() {
  if (disks_.empty()) return;
  switch (in_.ConsumeIntegralInRange(0, 2)) {
    case 0: {  // a flipped byte on the disk
      MemoryDisk& disk = *disks_[0];
      disk.data()[in_.ConsumeIntegralInRange<uint64_t>(0, disk.bytes() - 1)] ^=
          std::byte{in_.ConsumeIntegralInRange<uint8_t>(1, 255)};
      break;
    }
    case 1:
      devices_[0]->fail_writes = !devices_[0]->fail_writes;
      break;
    default:
      devices_[0]->fail_reads = !devices_[0]->fail_reads;
  }
}

void CoreFuzzDriver::Scribble() {
  const uint64_t at = in_.ConsumeIntegralInRange<uint64_t>(0, client_arena_->bytes() - 1);
  const std::string bytes = in_.ConsumeRandomLengthString(64);
  std::memcpy(client_arena_->base() + at, bytes.data(),
              std::min<uint64_t>(bytes.size(), client_arena_->bytes() - at));
  scribbled_ = scribbled_ || !bytes.empty();
}

void CoreFuzzDriver::CheckStats() {
  v1::StatsResponse s;
  wire::Run(*core_, &s);
  FUZZ_CHECK(s.sessions() == sessions_.size(), "Stats count other sessions");
  FUZZ_CHECK(s.active_leases() == leases_.size(), "Stats count other leases");
  FUZZ_CHECK(s.active_reservations() == reservations_.size(), "Stats count other reservations");
  FUZZ_CHECK(s.active_prefetches() == tickets_.size(), "Stats count other prefetch tickets");
  FUZZ_CHECK(s.hit_tokens() <= s.lookup_tokens(), "more hit tokens than looked up");
  uint64_t model_lookup = 0, model_hit = 0, model_unserved = 0;
  for (const v1::ModelStats& m : s.models()) {
    model_lookup += m.lookup_tokens();
    model_hit += m.hit_tokens().hbm() + m.hit_tokens().dram() + m.hit_tokens().nvme() +
                 m.hit_tokens().remote();
    model_unserved += m.unserved_hit_tokens().hbm() + m.unserved_hit_tokens().dram() +
                      m.unserved_hit_tokens().nvme() + m.unserved_hit_tokens().remote();
  }
  FUZZ_CHECK(model_lookup == s.lookup_tokens(), "models' lookup tokens do not add up");
  FUZZ_CHECK(model_hit == s.hit_tokens(), "models' hit tokens do not add up");
  FUZZ_CHECK(model_unserved == s.unserved_hit_tokens(), "models' unserved tokens do not add up");
  for (const v1::TierStats& t : s.tiers()) {
    FUZZ_CHECK(t.used_bytes() <= t.capacity_bytes(), "a tier uses more than its capacity");
  }
}

void CoreFuzzDriver::Finish() {
  for (uint64_t s : std::vector<uint64_t>(sessions_)) {
    core_->EndSession(s);
    ended_sessions_.push_back(s);
    DropSession(s);
  }
  sessions_.clear();
  CheckStats();
  v1::StatsResponse s;
  wire::Run(*core_, &s);
  v1::NamespacesResponse n;
  wire::Run(*core_, &n);
  uint64_t slots = 0, chunks = 0;
  for (const v1::NamespaceInfo& info : n.namespaces()) {
    slots += info.chunks() * info.slot_bytes();
    chunks += info.chunks();
  }
  const v1::TierStats& dram = s.tiers(0);
  FUZZ_CHECK(dram.name() == "dram" && dram.chunks() == chunks,
             "DRAM's chunks differ from its namespaces'");
  FUZZ_CHECK(dram.used_bytes() == slots, "DRAM slots are left over after every session ended");
}

}  // namespace kvtier::fuzz
