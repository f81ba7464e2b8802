// RemoteTier: slot images in a store shared by many daemons (a Redis Cluster
// or one Redis/Valkey server, through RedisCluster), below NVMe.
//
// An image is stored whole (header, tokens, payload; no padding) under
// ImageKey(namespace digest, chunk key), sealed with its payload checksum. The
// store is shared and not trusted (DESIGN.md, Threat model): every read is
// verified before it counts as a hit (its length, then header, namespace, key,
// parent and tokens against what the lookup asked for, header checksum and
// payload checksum); a mismatch is a miss, counted in corrupt_reads, and the
// value is left alone (another daemon may own it). Those checks catch damage,
// not forgery: the checksums are unkeyed and every header field follows from
// public data, so whoever can write to the store could plant images of chosen
// prompts. With a MAC key (RemoteTierOptions::mac_key, a secret the cluster's
// daemons share) each image is stored with a keyed MAC after it and a read
// whose MAC does not verify is a corrupt miss; without one the store must be
// trusted. Redis's own maxmemory policy evicts (README: "Several nodes").
//
// Failures are misses, never errors: a store down, slow or full answers
// UNAVAILABLE per image. A batch fails when no image of it got an answer (one
// dead master of a cluster fails only its own keys; io_errors counts every
// batch with an unanswered image). After kDegradedAfter failed batches in a row the
// tier is degraded: calls then skip the store (at once, so lookups do not wait
// on its timeouts), while a thread of its own probes it every probe_interval
// until it answers.
//
// kvtierd's CacheCore drives it: its NVMe writer also writes each batch here,
// its Promoter reads a prefix's continuation here after NVMe's.
//
// Thread-safety: thread-safe; calls from several threads run in parallel.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kvtier/logging.h"
#include "kvtier/slot_image.h"
#include "kvtier/status.h"
#include "kvtier/tiers/nvme_tier.h"
#include "kvtier/tiers/redis_cluster.h"

namespace kvtier {

struct RemoteTierOptions {
  // "redis://host:port[,host:port...]": seeds of a cluster, or one server.
  // Empty: the tier is off. Default: off.
  std::string url;
  // Connections per store node. Range 1..256. Default: 4.
  uint32_t pool_size = 4;
  // Longest wait for one node's answers to a batch (and to connect), plus 1 s
  // per 64 MiB the batch moves (a batch of the NVMe writer may hold 64 MiB of
  // images; RedisClusterOptions::io_timeout). Range 1..60,000 ms. Default: 200 ms.
  std::chrono::milliseconds timeout{200};
  // A TTL on each image, in seconds; 0: none (maxmemory evicts). Default: 0.
  uint32_t expire_seconds = 0;
  // While degraded, least time between two probes of the store. Default: 1 s.
  std::chrono::milliseconds probe_interval{1000};
  // The secret of the images' MAC: empty (no MAC) or kMacKeyBytes bytes, the
  // same on every daemon of the store. Set: each image is stored followed by
  // kMacBytes of keyed BLAKE2b-256 (libsodium's crypto_generichash) over its
  // store key and bytes, and read back only when they verify. A daemon with a
  // key reads no image written without it, or under another key (corrupt
  // misses). Default: empty.
  std::string mac_key;
  static constexpr size_t kMacKeyBytes = 32;
  static constexpr size_t kMacBytes = 32;

  Status Validate() const;  // INVALID_ARGUMENT naming the field
};

struct RemoteTierCounters {
  uint64_t hits = 0;           // images read and verified
  uint64_t misses = 0;         // images the store did not hold
  uint64_t corrupt_reads = 0;  // images that failed verification (a miss each)
  uint64_t read_bytes = 0;     // payload bytes of the verified images
  uint64_t writes = 0;         // images stored
  uint64_t write_bytes = 0;    // their payload bytes
  uint64_t failed_writes = 0;  // images the store did not take
  uint64_t io_errors = 0;      // batches with an image the store did not answer for (a node
                               // down, slow or full, an error answer)
  uint64_t skipped = 0;        // images not asked for or written because the tier was degraded
};

class RemoteTier {
 public:
  static constexpr uint32_t kDegradedAfter = 3;

  // Checks the options and parses the URL; connects to nothing yet (a store
  // not up at start is found when it comes up). Errors: INVALID_ARGUMENT.
  static Result<std::unique_ptr<RemoteTier>> Open(const RemoteTierOptions& options);
  ~RemoteTier();

  // "kvtier:" + 32 hex digits of the namespace digest + ":" + 32 of the chunk
  // key (no braces: images spread over the cluster's slots).
  static std::string ImageKey(const NamespaceId& ns, const ChunkKey& key);

  // One read of ReadMany.
  struct ReadRequest {
    SlotIdentity id;
    const SlotLayout* layout = nullptr;
    std::span<std::byte> buffer;  // at least layout->slot_bytes
    Status result;                // OK (a verified image), NOT_FOUND, DATA_LOSS, UNAVAILABLE
  };
  // Reads and verifies each image (pipelined, one batch per store node).
  void ReadMany(std::span<ReadRequest> requests);

  // Stores sealed images (NvmeImage: exactly the slot bytes, payload checksum
  // sealed); returns how many the store took.
  size_t WriteMany(std::span<const NvmeImage> images);

  // How many of `keys` (a prompt's chunks in order) the store holds, in a row
  // from the first (not verified: a later read may still miss); 0 while degraded.
  size_t PresentRun(const NamespaceId& ns, std::span<const ChunkKey> keys);

  // Whether the store answers now: OK when any of a few keys spread over its
  // slots gets an answer (an EXISTS each), else UNAVAILABLE saying why (for
  // a warning at start; the counters are not touched).
  Status Probe();
  // Probe at start: a store that does not answer starts the tier degraded
  // (calls skip it; the prober finds it when it comes up). Returns Probe's.
  Status CheckAtStart();

  bool Degraded() const;
  RemoteTierCounters counters() const;
  // The store's nodes now known ("host:port" each) and whether it is a cluster.
  std::vector<std::string> Nodes() const;
  bool cluster_mode() const { return store_->cluster_mode(); }
  const RemoteTierOptions& options() const { return options_; }

 private:
  RemoteTier(const RemoteTierOptions& options, std::unique_ptr<RedisCluster> store);
  // Whether a batch may go to the store now: not degraded.
  bool MayCall();
  // The prober thread: while degraded, Probe every probe_interval.
  void ProbeLoop();
  // Notes how a batch went: `answered` (some image got an answer: the store
  // is up) and `whole` (every image did; else `example` says why one did not).
  void NoteBatch(bool answered, bool whole, const Status& example);

  const RemoteTierOptions options_;
  std::unique_ptr<RedisCluster> store_;
  mutable std::mutex mu_;
  RemoteTierCounters counters_;       // GUARDED_BY(mu_)
  uint32_t failure_streak_ = 0;       // GUARDED_BY(mu_)
  bool stopping_ = false;             // GUARDED_BY(mu_)
  std::condition_variable probe_cv_;  // degraded, or stopping
  LogLimiter corrupt_log_;            // one verification warning per 10 s
  LogLimiter partial_log_;            // batches with unanswered images, one per 10 s
  LogLimiter full_log_;               // OOM refusals, one per 10 s
  std::thread prober_;                // last: started once the rest is built
};

}  // namespace kvtier
