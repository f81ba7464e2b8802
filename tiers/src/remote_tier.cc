#include "kvtier/tiers/remote_tier.h"

#include <sodium.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "kvtier/logging.h"

namespace kvtier {
namespace {

// The image's length in the store: header (with tokens) and payload.
uint64_t StoredBytes(const SlotLayout& layout) {
  return layout.header_bytes + layout.payload_bytes;
}

// What a sealed image says of itself: its header and payload bytes.
uint64_t StoredBytes(std::span<const std::byte> image) {
  SlotHeader h;
  std::memcpy(&h, image.data(), sizeof(h));
  return uint64_t{h.header_bytes} + h.payload_bytes;
}

using MacBytes = std::array<unsigned char, RemoteTierOptions::kMacBytes>;

// The MAC of the image stored under `name`: keyed BLAKE2b-256 over a domain
// tag, the store key and the image bytes (REQUIRES: key of kMacKeyBytes).
MacBytes ImageMac(const std::string& key, std::string_view name, std::span<const std::byte> image) {
  static constexpr std::string_view kDomain{"kvtier remote image MAC v1", 27};  // with its NUL
  crypto_generichash_state state;
  crypto_generichash_init(&state, reinterpret_cast<const unsigned char*>(key.data()), key.size(),
                          RemoteTierOptions::kMacBytes);
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(kDomain.data()),
                            kDomain.size());
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(name.data()),
                            name.size());
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(image.data()),
                            image.size());
  MacBytes mac;
  crypto_generichash_final(&state, mac.data(), mac.size());
  return mac;
}

}  // namespace

Status RemoteTierOptions::Validate() const {
  if (!mac_key.empty() && mac_key.size() != kMacKeyBytes) {
    return Status::InvalidArgument("remote MAC key is " + std::to_string(mac_key.size()) +
                                   " bytes, not " + std::to_string(kMacKeyBytes));
  }
  if (url.empty()) return Status::InvalidArgument("remote: the URL is empty");
  if (pool_size < 1 || pool_size > 256) {
    return Status::InvalidArgument("remote_pool_size " + std::to_string(pool_size) +
                                   " is out of range 1..256");
  }
  if (timeout.count() < 1 || timeout.count() > 60'000) {
    return Status::InvalidArgument("remote_timeout_ms " + std::to_string(timeout.count()) +
                                   " is out of range 1..60000");
  }
  if (probe_interval.count() < 1) {
    return Status::InvalidArgument("remote probe_interval must be positive");
  }
  return Status::Ok();
}

Result<std::unique_ptr<RemoteTier>> RemoteTier::Open(const RemoteTierOptions& options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  auto seeds = ParseRedisUrl(options.url);
  if (!seeds.ok()) return seeds.status();
  RedisClusterOptions store_options;
  store_options.seeds = std::move(*seeds);
  store_options.pool_size = options.pool_size;
  store_options.io_timeout = options.timeout;
  store_options.connect_timeout = options.timeout;
  if (!options.mac_key.empty() && sodium_init() < 0) {
    return Status::Internal("libsodium could not be initialized (for the remote images' MAC)");
  }
  auto store = RedisCluster::Create(store_options);
  if (!store.ok()) return store.status();
  return std::unique_ptr<RemoteTier>(new RemoteTier(options, std::move(*store)));
}

RemoteTier::RemoteTier(const RemoteTierOptions& options, std::unique_ptr<RedisCluster> store)
    : options_(options), store_(std::move(store)), prober_([this] { ProbeLoop(); }) {}

RemoteTier::~RemoteTier() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  probe_cv_.notify_all();
  prober_.join();
}

Status RemoteTier::Probe() {
  // Keys of 16 hash tags: slots spread over a cluster's masters, one answer is enough.
  std::vector<std::string> names;
  std::vector<RedisCluster::Exists> exists;
  for (int i = 0; i < 16; ++i) names.push_back("kvtier:probe:{" + std::to_string(i) + "}");
  for (const std::string& name : names) exists.push_back({name, false, {}});
  store_->ExistsMany(exists);
  for (const RedisCluster::Exists& e : exists) {
    if (e.result.ok()) return Status::Ok();
  }
  return exists.front().result;
}

Status RemoteTier::CheckAtStart() {
  Status st = Probe();
  if (st.ok()) return st;
  std::lock_guard lock(mu_);
  failure_streak_ = std::max(failure_streak_, kDegradedAfter);
  probe_cv_.notify_all();
  return st;
}

void RemoteTier::ProbeLoop() {
  std::unique_lock lock(mu_);
  for (;;) {
    probe_cv_.wait(lock, [&] { return stopping_ || failure_streak_ >= kDegradedAfter; });
    if (probe_cv_.wait_for(lock, options_.probe_interval, [&] { return stopping_; })) return;
    if (failure_streak_ < kDegradedAfter) continue;  // a call's batch found it back meanwhile
    lock.unlock();
    const bool answered = Probe().ok();
    lock.lock();
    if (answered && failure_streak_ >= kDegradedAfter) {
      failure_streak_ = 0;
      spdlog::info("remote tier answers again; no longer degraded");
    }
  }
}

std::string RemoteTier::ImageKey(const NamespaceId& ns, const ChunkKey& key) {
  return "kvtier:" + ns.ToHex() + ":" + key.ToHex();
}

bool RemoteTier::MayCall() {
  std::lock_guard lock(mu_);
  return failure_streak_ < kDegradedAfter;
}

void RemoteTier::NoteBatch(bool answered, bool whole, const Status& example) {
  std::lock_guard lock(mu_);
  if (!whole) ++counters_.io_errors;
  if (answered && !whole) {  // a node down or slow, the others answering
    if (auto held = partial_log_.Admit()) {
      spdlog::warn(
          "remote tier: a batch had images no store node answered for (a miss each): "
          "{}{}",
          example.message(), HeldBack(*held));
    }
  }
  if (answered) {
    failure_streak_ = 0;
  } else if (++failure_streak_ == kDegradedAfter) {
    spdlog::error(
        "remote tier degraded: {} batches failed in a row ({}); lookups miss it, "
        "probing every {} ms",
        kDegradedAfter, options_.url, options_.probe_interval.count());
    probe_cv_.notify_all();
  }
}

bool RemoteTier::Degraded() const {
  std::lock_guard lock(mu_);
  return failure_streak_ >= kDegradedAfter;
}

RemoteTierCounters RemoteTier::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

std::vector<std::string> RemoteTier::Nodes() const {
  std::vector<std::string> nodes;
  for (const RedisEndpoint& e : store_->Masters()) nodes.push_back(e.ToString());
  return nodes;
}

void RemoteTier::ReadMany(std::span<ReadRequest> requests) {
  if (requests.empty()) return;
  if (!MayCall()) {
    for (ReadRequest& r : requests) r.result = Status::Unavailable("remote tier degraded");
    std::lock_guard lock(mu_);
    counters_.skipped += requests.size();
    return;
  }
  const size_t mac_bytes = options_.mac_key.empty() ? 0 : RemoteTierOptions::kMacBytes;
  std::vector<std::string> keys;
  std::vector<RedisCluster::Get> gets;
  // An image and its MAC land in the slot (its padding holds the MAC) or, where
  // the padding is too short, here first.
  std::vector<std::vector<std::byte>> spill(requests.size());
  keys.reserve(requests.size());
  gets.reserve(requests.size());
  for (const ReadRequest& r : requests) keys.push_back(ImageKey(r.id.ns, r.id.key));
  for (size_t i = 0; i < requests.size(); ++i) {
    const SlotLayout& layout = *requests[i].layout;
    std::span<std::byte> dst = requests[i].buffer.first(layout.slot_bytes);
    if (StoredBytes(layout) + mac_bytes > dst.size()) {
      spill[i].resize(StoredBytes(layout) + mac_bytes);
      dst = spill[i];
    }
    gets.push_back({keys[i], dst, 0, {}});
  }
  store_->GetMany(gets);
  size_t unavailable = 0;
  Status first_unavailable;
  RemoteTierCounters add;
  for (size_t i = 0; i < requests.size(); ++i) {
    ReadRequest& r = requests[i];
    const RedisCluster::Get& g = gets[i];
    r.result = g.result;
    if (g.result.code() == StatusCode::kNotFound) {
      ++add.misses;
      continue;
    }
    if (g.result.code() == StatusCode::kUnavailable) {
      if (unavailable++ == 0) first_unavailable = g.result;
      continue;
    }
    const uint64_t image_bytes = StoredBytes(*r.layout);
    if (g.result.ok() && g.bytes != image_bytes + mac_bytes) {
      r.result = Status::DataLoss("remote image of " + std::to_string(g.bytes) +
                                  " bytes, expected " + std::to_string(image_bytes + mac_bytes) +
                                  (mac_bytes == 0 ? std::string() : " (the image and its MAC)"));
    }
    if (r.result.ok() && mac_bytes != 0) {
      const MacBytes mac = ImageMac(options_.mac_key, keys[i], g.dst.first(image_bytes));
      if (crypto_verify_32(mac.data(), reinterpret_cast<const unsigned char*>(g.dst.data() +
                                                                              image_bytes)) != 0) {
        r.result = Status::DataLoss(
            "remote image MAC does not verify (written without this "
            "daemon's --remote-key-file, or forged)");
      }
      if (!spill[i].empty() && r.result.ok()) {
        std::memcpy(r.buffer.data(), spill[i].data(), image_bytes);
      } else if (spill[i].empty()) {
        std::memset(g.dst.data() + image_bytes, 0, mac_bytes);  // the slot's padding again
      }
    }
    if (r.result.ok()) {
      r.result = VerifySlotHeader(r.buffer.data(), *r.layout, r.id, /*check_header_checksum=*/true);
    }
    if (r.result.ok()) r.result = VerifySlotPayload(r.buffer.data(), *r.layout);
    if (r.result.ok()) {
      ++add.hits;
      add.read_bytes += r.layout->payload_bytes;
      continue;
    }
    ++add.corrupt_reads;
    ++add.misses;
    if (auto held = corrupt_log_.Admit()) {
      spdlog::warn("remote image {} failed verification (a miss): {}{}", keys[i],
                   r.result.message(), HeldBack(*held));
    }
  }
  NoteBatch(unavailable < requests.size(), unavailable == 0, first_unavailable);
  std::lock_guard lock(mu_);
  counters_.hits += add.hits;
  counters_.misses += add.misses;
  counters_.corrupt_reads += add.corrupt_reads;
  counters_.read_bytes += add.read_bytes;
}

size_t RemoteTier::WriteMany(std::span<const NvmeImage> images) {
  if (images.empty()) return 0;
  if (!MayCall()) {
    std::lock_guard lock(mu_);
    counters_.skipped += images.size();
    return 0;
  }
  std::vector<std::string> keys;
  std::vector<RedisCluster::Set> sets;
  keys.reserve(images.size());
  sets.reserve(images.size());
  for (const NvmeImage& image : images) keys.push_back(ImageKey(image.ns, image.key));
  std::vector<std::vector<std::byte>> sealed;  // with a MAC key: each image, then its MAC
  if (!options_.mac_key.empty()) sealed.resize(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    std::span<const std::byte> value = images[i].image.first(StoredBytes(images[i].image));
    if (!sealed.empty()) {
      const MacBytes mac = ImageMac(options_.mac_key, keys[i], value);
      sealed[i].reserve(value.size() + mac.size());
      sealed[i].assign(value.begin(), value.end());
      const auto* m = reinterpret_cast<const std::byte*>(mac.data());
      sealed[i].insert(sealed[i].end(), m, m + mac.size());
      value = sealed[i];
    }
    sets.push_back({keys[i], value, {}});
  }
  store_->SetMany(sets, options_.expire_seconds);
  size_t stored = 0, full = 0;
  uint64_t bytes = 0;
  Status first_unavailable;
  for (size_t i = 0; i < sets.size(); ++i) {
    full += sets[i].result.code() == StatusCode::kResourceExhausted;
    if (sets[i].result.code() == StatusCode::kUnavailable && first_unavailable.ok()) {
      first_unavailable = sets[i].result;
    }
    if (!sets[i].result.ok()) continue;
    ++stored;
    SlotHeader h;
    std::memcpy(&h, images[i].image.data(), sizeof(h));
    bytes += h.payload_bytes;
  }
  // A full store answers (its reads go on): not a failure towards degraded.
  if (full > 0) {
    if (auto held = full_log_.Admit()) {
      spdlog::warn(
          "remote tier: the store is full and refused {} of {} images (OOM: give it "
          "maxmemory-policy allkeys-lru, README \"Several nodes\"){}",
          full, images.size(), HeldBack(*held));
    }
  }
  NoteBatch(stored + full > 0, stored + full == images.size(), first_unavailable);
  std::lock_guard lock(mu_);
  counters_.writes += stored;
  counters_.write_bytes += bytes;
  counters_.failed_writes += images.size() - stored;
  return stored;
}

size_t RemoteTier::PresentRun(const NamespaceId& ns, std::span<const ChunkKey> keys) {
  if (keys.empty() || !MayCall()) return 0;
  std::vector<std::string> names;
  std::vector<RedisCluster::Exists> exists;
  names.reserve(keys.size());
  exists.reserve(keys.size());
  for (const ChunkKey& key : keys) names.push_back(ImageKey(ns, key));
  for (const std::string& name : names) exists.push_back({name, false, {}});
  store_->ExistsMany(exists);
  size_t run = 0;
  size_t answered = 0;
  Status first_unavailable;
  for (const RedisCluster::Exists& e : exists) {
    answered += e.result.ok();
    if (!e.result.ok() && first_unavailable.ok()) first_unavailable = e.result;
  }
  while (run < exists.size() && exists[run].result.ok() && exists[run].found) ++run;
  NoteBatch(answered > 0, answered == exists.size(), first_unavailable);
  return run;
}

}  // namespace kvtier
