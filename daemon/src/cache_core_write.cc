// CacheCore's write path: ReserveWrite (slots for a prompt's new chunks),
// CommitWrite (into the DRAM index, queued for NVMe) and AbortWrite.
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/daemon/cache_core.h"

namespace kvtier {
namespace {

// Token ids of a packed little-endian int32 byte string.
std::vector<int32_t> UnpackTokens(std::string_view bytes) {
  std::vector<int32_t> tokens(bytes.size() / 4);
  std::memcpy(tokens.data(), bytes.data(), tokens.size() * 4);
  return tokens;
}

std::string Field(const char* name, size_t i, const char* sub) {
  return std::string(name) + "[" + std::to_string(i) + "]." + sub;
}

}  // namespace

Status CacheCore::ReserveWrite(const core::ReserveWriteRequest& req,
                               core::ReserveWriteResponse* resp) {
  using core::ReserveOutcome;
  const size_t n = req.chunks.size();
  if (n == 0) return Status::InvalidArgument("chunks is empty");
  if (n > options_.max_chunks_per_request) {
    return Status::InvalidArgument("chunks holds " + std::to_string(n) +
                                   " entries, more than the limit of " +
                                   std::to_string(options_.max_chunks_per_request));
  }
  NamespaceSpec spec;
  NamespaceId ns_id;
  {
    std::lock_guard lock(mu_);
    KVTIER_RETURN_IF_ERROR(CheckSession(req.session_id));
    KVTIER_RETURN_IF_ERROR(CheckEpoch(req.epoch));
    auto found = FindNamespace(req.namespace_id);
    if (!found.ok()) return found.status();
    spec = (*found)->spec;
    ns_id = (*found)->id;
  }
  const uint32_t chunk_tokens = spec.chunk_tokens;
  // Validate every chunk before touching any state.
  std::vector<ReservedChunk> chunks(n);
  for (size_t i = 0; i < n; ++i) {
    const core::ChunkToWrite& c = req.chunks[i];
    auto key = ChunkKey::FromWire(c.key);
    if (!key) return Status::InvalidArgument(Field("chunks", i, "key") + " is not 16 bytes");
    auto parent = ChunkKey::FromWire(c.parent_key);
    if (!parent) {
      return Status::InvalidArgument(Field("chunks", i, "parent_key") + " is not 16 bytes");
    }
    if (c.tokens.size() != uint64_t{chunk_tokens} * 4) {
      return Status::InvalidArgument(Field("chunks", i, "tokens") + " is " +
                                     std::to_string(c.tokens.size()) + " bytes, not " +
                                     std::to_string(chunk_tokens) + " int32 token ids (" +
                                     std::to_string(chunk_tokens * 4) + " bytes)");
    }
    if (spec.engine_keyed) {
      if (*parent != ns_id) {
        return Status::InvalidArgument(Field("chunks", i, "parent_key") +
                                       " is not the namespace id (engine-keyed namespace)");
      }
    } else if (i > 0 && *parent != chunks[i - 1].key) {
      return Status::InvalidArgument(Field("chunks", i, "parent_key") +
                                     " is not the key of chunks[" + std::to_string(i - 1) + "]");
    }
    chunks[i].tokens = UnpackTokens(c.tokens);
    if (spec.ChunkKeyOf(*parent, chunks[i].tokens) != *key) {
      return Status::InvalidArgument(Field("chunks", i, "key") +
                                     " is not XXH3-128(parent_key || tokens)");
    }
    chunks[i].key = *key;
    chunks[i].parent = *parent;
  }

  std::unique_lock lock(mu_);
  KVTIER_RETURN_IF_ERROR(CheckSession(req.session_id));
  if (nvme_ && options_.nvme_write_policy == NvmeWritePolicy::kWriteThrough &&
      !destager_->WaitForRoom(lock, static_cast<uint64_t>(n) * SlotLayout::For(spec).slot_bytes)) {
    // Admitting them would evict chunks still waiting for their NVMe write.
    resp->outcomes.assign(n, ReserveOutcome::kNvmeBehind);
    counters_.nvme_throttled_writes += n;
    return Status::Ok();
  }
  KVTIER_RETURN_IF_ERROR(CheckSession(req.session_id));  // it may have ended while waiting
  // Found again under this lock: an idle namespace's state may have been given
  // to another namespace while the keys were checked (then this is NOT_FOUND).
  auto found = FindNamespace(req.namespace_id);
  if (!found.ok()) return found.status();
  NamespaceState* ns = const_cast<NamespaceState*>(*found);
  Reservation r;
  r.session_id = req.session_id;
  r.expiry = clock_.Now() + options_.reservation_ttl;
  r.reserved_at = std::chrono::steady_clock::now();
  r.ns = ns;
  // Each pin and each slot counts against the session's session_max_bytes.
  size_t allowed = SessionAllowance(r.session_id, ns->layout.slot_bytes);
  auto pin = [&](uint32_t h) {
    dram_->Touch(h);
    dram_->Pin(h);
    r.pinned.push_back(h);
    --allowed;
  };
  resp->reservation_ttl_ms = static_cast<uint64_t>(options_.reservation_ttl.count());
  // A commit keeps only chunks whose parent is there: check before evicting
  // anything for slots that could never be committed.
  const uint32_t parent = dram_->Find(chunks[0].parent);
  if (parent != ChunkIndex::kNone && allowed == 0) {
    resp->outcomes.assign(n, ReserveOutcome::kSessionLimit);
    ++counters_.session_limited;
    return Status::Ok();
  }
  if (parent != ChunkIndex::kNone) {
    pin(parent);
  } else if (chunks[0].parent != ns->id && reserved_keys_.count(chunks[0].parent) == 0) {
    resp->outcomes.assign(n, ReserveOutcome::kNoParent);
    return Status::Ok();
  }
  bool out_of_space = false, key_taken = false, limited = false;
  resp->outcomes.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    ReservedChunk& c = chunks[i];
    if (key_taken) {
      resp->outcomes.push_back(ReserveOutcome::kKeyTaken);  // its parent is not this prompt's chunk
      continue;
    }
    if (!out_of_space && !limited && allowed == 0) {
      limited = true;  // later chunks would be orphans without this one
      ++counters_.session_limited;
    }
    if (limited) {
      resp->outcomes.push_back(ReserveOutcome::kSessionLimit);
      continue;
    }
    if (!out_of_space) {
      if (uint32_t h = dram_->Find(c.key); h != ChunkIndex::kNone) {
        if (!ResidentIs(*ns, h, c)) {
          resp->outcomes.push_back(ReserveOutcome::kKeyTaken);
          key_taken = true;
          continue;
        }
        pin(h);
        resp->outcomes.push_back(ReserveOutcome::kAlreadyStored);
        continue;
      }
      if (reserved_keys_.count(c.key) > 0) {  // another reservation is writing it now
        resp->outcomes.push_back(ReserveOutcome::kBeingWritten);
        continue;
      }
      if (auto offset = dram_->AllocateSlot(ns->ns_index, std::min<size_t>(n - i, allowed))) {
        c.slot_offset = *offset;
        // A reader whose lease lapsed may still be copying the slot's old
        // chunk: clear the header first so that reader sees the change.
        InvalidateSlot(dram_->SlotAddress(c.slot_offset));
        core::ChunkLocation& loc = resp->chunks.emplace_back();
        loc.payload_offset = c.slot_offset + ns->layout.header_bytes;
        loc.payload_bytes = ns->layout.payload_bytes;
        resp->outcomes.push_back(ReserveOutcome::kReserved);
        reserved_keys_.insert(c.key);
        r.chunks.push_back(std::move(c));
        --allowed;
        continue;
      }
      out_of_space = true;  // later chunks would be orphans without this one
    }
    resp->outcomes.push_back(ReserveOutcome::kNoSpace);
  }
  if (r.chunks.empty()) {
    for (uint32_t h : r.pinned) dram_->Unpin(h);
    return Status::Ok();
  }
  ++ns->active_reservations;
  r.held_bytes = (r.chunks.size() + r.pinned.size()) * ns->layout.slot_bytes;
  Hold(r.session_id, r.held_bytes);
  const uint64_t id = next_id_++;
  reservations_.Add(id, std::move(r));
  resp->reservation_id = id;
  return Status::Ok();
}

void CacheCore::ReleaseReservationHolds(Reservation& r) {
  for (uint32_t h : r.pinned) dram_->Unpin(h);
  const uint64_t pins = r.pinned.size() * r.ns->layout.slot_bytes;
  Drop(r.session_id, pins);  // its slots stay held until they are freed
  r.held_bytes -= pins;
  r.pinned.clear();
  for (const ReservedChunk& c : r.chunks) reserved_keys_.erase(c.key);
}

void CacheCore::FreeReservationSlots(const Reservation& r) {
  for (const ReservedChunk& c : r.chunks) dram_->FreeSlot(r.ns->ns_index, c.slot_offset);
  Drop(r.session_id, r.held_bytes);
  --r.ns->active_reservations;
}

void CacheCore::FreeReservation(Reservation& r) {
  ReleaseReservationHolds(r);
  FreeReservationSlots(r);
}

Status CacheCore::CommitWrite(uint64_t session_id, uint64_t reservation_id,
                              core::CommitWriteResponse* resp) {
  Reservation r;
  uint64_t first_sequence;
  {
    std::lock_guard lock(mu_);
    KVTIER_RETURN_IF_ERROR(CheckSession(session_id));
    auto taken = reservations_.Take(reservation_id, session_id);
    if (!taken.ok()) return taken.status();
    r = std::move(*taken);
    Drop(r.session_id, r.held_bytes);
    first_sequence = next_sequence_;
    next_sequence_ += r.chunks.size();
  }
  // The reservation owns these slots: seal them without the lock. The payload
  // checksum is left pending: DRAM serves by the token check, and the NVMe
  // writer computes the checksum off this path before the image goes to disk.
  const NamespaceState& ns = *r.ns;
  for (size_t i = 0; i < r.chunks.size(); ++i) {
    const ReservedChunk& c = r.chunks[i];
    SealSlot(dram_->SlotAddress(c.slot_offset), ns.layout, {ns.id, c.key, c.parent, c.tokens},
             first_sequence + i, /*with_payload_checksum=*/false);
  }
  std::lock_guard lock(mu_);
  for (uint32_t h : r.pinned) dram_->Unpin(h);
  --r.ns->active_reservations;
  uint32_t committed = 0, dropped = 0;
  for (const ReservedChunk& c : r.chunks) {
    reserved_keys_.erase(c.key);
    if (dram_->Insert(c.key, c.parent, ns.id, ns.ns_index, c.slot_offset) == ChunkIndex::kNone) {
      dram_->FreeSlot(ns.ns_index, c.slot_offset);  // parent evicted meanwhile, or a duplicate
      ++dropped;
    } else {
      ++committed;
    }
  }
  counters_.write_bytes += uint64_t{committed} * ns.layout.payload_bytes;
  if (nvme_ && options_.nvme_write_policy == NvmeWritePolicy::kWriteThrough) {
    // Queued for the NVMe worker, never waited for here.
    for (const ReservedChunk& c : r.chunks) {
      const uint32_t h = dram_->Find(c.key);
      if (h == ChunkIndex::kNone || dram_->Get(h).slot_offset != c.slot_offset) continue;
      destager_->Queue(h);
    }
  }
  resp->committed_chunks = committed;
  resp->dropped_chunks = dropped;
  store_latency_.Observe(std::chrono::steady_clock::now() - r.reserved_at);
  return Status::Ok();
}

Status CacheCore::AbortWrite(uint64_t session_id, uint64_t reservation_id) {
  std::lock_guard lock(mu_);
  KVTIER_RETURN_IF_ERROR(CheckSession(session_id));
  auto r = reservations_.Take(reservation_id, session_id);
  if (!r.ok()) return r.status();
  FreeReservation(*r);
  return Status::Ok();
}

}  // namespace kvtier
