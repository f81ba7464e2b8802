// kvtier-bench remote: RemoteTier against pipelined hiredis on the same store (remote.h).
#include "remote.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <utility>

#include "bench_common.h"
#include "kvtier/chunk_key.h"
#include "kvtier/slot_image.h"
#include "kvtier/tiers/redis_cluster.h"
#include "kvtier/tiers/remote_tier.h"
#include "kvtier/tools/percentiles.h"
#include "kvtier/units.h"
#include "redis_process.h"

namespace kvtier::bench {
namespace {

using tools::Percentile;

constexpr int kMasters = 3;
constexpr int kNumSlots = 16384;
// The tier's wait for one node's answers: a round of 4 MiB images is 64 MiB, and a benchmark
// measures; it must not fail open.
constexpr std::chrono::milliseconds kTierTimeout{10000};

// Runs one command; exits (naming `what`) when no answer comes or the answer is an error.
RedisReplyPtr RunOrDie(redisContext* c, const std::vector<std::string>& argv,
                       const std::string& what) {
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) args.push_back(a.data()), lens.push_back(a.size());
  RedisReplyPtr r(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(args.size()), args.data(), lens.data())));
  if (r == nullptr) Die(what + ": " + argv[0] + ": " + c->errstr);
  if (r->type == REDIS_REPLY_ERROR) Die(what + ": " + argv[0] + ": " + std::string(r->str, r->len));
  return r;
}

// "field:value" of a CLUSTER INFO answer; "" when absent.
std::string InfoField(const redisReply& info, const std::string& field) {
  const std::string text(info.str, info.len);
  const size_t at = text.find(field + ":");
  if (at == std::string::npos) return "";
  const size_t from = at + field.size() + 1;
  return text.substr(from, text.find_first_of("\r\n", from) - from);
}

class OwnStore;
OwnStore* live_store = nullptr;  // the one started, for the atexit hook (Die exits)
void StopLiveStore();

// The store the benchmark starts: redis-server processes on loopback, in a directory of
// their own (a cluster node writes its nodes.conf), stopped and removed by Stop(): by the
// destructor, or at exit when the benchmark dies first.
class OwnStore {
 public:
  OwnStore(const std::string& binary, bool single) {
    std::string made =
        std::filesystem::temp_directory_path().string() + "/kvtier-bench-remote.XXXXXX";
    if (mkdtemp(made.data()) == nullptr) Die("mkdtemp: " + std::string(std::strerror(errno)));
    dir_ = made;
    live_store = this;
    static const bool hooked = std::atexit(StopLiveStore) == 0;
    (void)hooked;
    const int n = single ? 1 : kMasters;
    std::vector<int> bus_ports;
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> args = {"--dir", dir_};
      if (!single) {
        bus_ports.push_back(FreeLoopbackPort());
        args.insert(args.end(),
                    {"--cluster-enabled", "yes", "--cluster-config-file",
                     dir_ + "/nodes-" + std::to_string(i) + ".conf", "--cluster-port",
                     std::to_string(bus_ports.back()), "--cluster-node-timeout", "5000"});
      }
      std::string why;
      nodes_.push_back(RedisProcess::Start(binary, args, &why));
      if (nodes_.back() == nullptr) {
        Die("the store: " + why +
            "; install redis-server (make deps does), pass --redis-server "
            "PATH, or --remote URL for a store of your own");
      }
    }
    if (!single) FormCluster(bus_ports);
  }
  ~OwnStore() { Stop(); }
  void Stop() {
    nodes_.clear();  // each stopped and reaped first
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
    live_store = nullptr;
  }
  OwnStore(const OwnStore&) = delete;
  OwnStore& operator=(const OwnStore&) = delete;

  std::string Url() const {
    std::string url = "redis://";
    for (size_t i = 0; i < nodes_.size(); ++i) {
      url += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(nodes_[i]->port());
    }
    return url;
  }

 private:
  // Slots split evenly (CLUSTER ADDSLOTSRANGE), the nodes meet (CLUSTER MEET), then a wait
  // (30 s at most) until every node says cluster_state:ok and knows them all.
  void FormCluster(const std::vector<int>& bus_ports) {
    std::vector<RedisContextPtr> c;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      c.push_back(ConnectRedisOrDie("127.0.0.1", nodes_[i]->port(), "the store"));
      const int first = static_cast<int>(i) * kNumSlots / kMasters;
      const int last = (static_cast<int>(i) + 1) * kNumSlots / kMasters - 1;
      RunOrDie(c[i].get(),
               {"CLUSTER", "ADDSLOTSRANGE", std::to_string(first), std::to_string(last)},
               "the store");
      if (i > 0) {
        RunOrDie(c[0].get(),
                 {"CLUSTER", "MEET", "127.0.0.1", std::to_string(nodes_[i]->port()),
                  std::to_string(bus_ports[i])},
                 "the store");
      }
    }
    const auto t0 = Clock::now();
    for (size_t i = 0; i < c.size(); ++i) {
      for (;;) {
        RedisReplyPtr info = RunOrDie(c[i].get(), {"CLUSTER", "INFO"}, "the store");
        if (InfoField(*info, "cluster_state") == "ok" &&
            InfoField(*info, "cluster_known_nodes") == std::to_string(kMasters)) {
          break;
        }
        if (Seconds(Clock::now() - t0) > 30) Die("the store: the cluster did not form in 30 s");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }

  std::string dir_;
  std::vector<std::unique_ptr<RedisProcess>> nodes_;
};

void StopLiveStore() {
  if (live_store != nullptr) live_store->Stop();
}

// The baseline: one hiredis connection per master, the slot map read once (CLUSTER SLOTS
// on the first seed; a server without cluster support serves every slot).
class Hiredis {
 public:
  explicit Hiredis(const std::string& url) {
    auto seeds = ParseRedisUrl(url);
    if (!seeds.ok()) Die("--remote: " + seeds.status().ToString());
    const RedisEndpoint& seed = seeds->front();
    RedisContextPtr c = ConnectRedisOrDie(seed.host, seed.port, "the store");
    RedisReplyPtr slots(static_cast<redisReply*>(redisCommand(c.get(), "CLUSTER SLOTS")));
    if (slots == nullptr) Die("the store: CLUSTER SLOTS: " + std::string(c->errstr));
    owner_.assign(kNumSlots, 0);
    if (slots->type != REDIS_REPLY_ARRAY) {  // "cluster support disabled": one server
      masters_.push_back(std::move(c));
      return;
    }
    std::vector<std::pair<std::string, int>> endpoints;
    for (size_t e = 0; e < slots->elements; ++e) {
      const redisReply& range = *slots->element[e];
      if (range.elements < 3 || range.element[2]->elements < 2) Die("the store: odd CLUSTER SLOTS");
      const redisReply& master = *range.element[2];
      std::pair<std::string, int> ep(std::string(master.element[0]->str, master.element[0]->len),
                                     static_cast<int>(master.element[1]->integer));
      if (ep.first.empty()) ep.first = seed.host;  // "" is the node asked
      size_t m = 0;
      while (m < endpoints.size() && endpoints[m] != ep) ++m;
      if (m == endpoints.size()) {
        endpoints.push_back(ep);
        masters_.push_back(ConnectRedisOrDie(ep.first, ep.second, "the store"));
      }
      for (long long s = range.element[0]->integer; s <= range.element[1]->integer; ++s) {
        owner_.at(static_cast<size_t>(s)) = static_cast<uint16_t>(m);
      }
    }
  }

  size_t num_masters() const { return masters_.size(); }

  // Index lists of `keys` per master, masters in order.
  std::vector<std::vector<size_t>> ByNode(const std::vector<std::string>& keys) const {
    std::vector<std::vector<size_t>> by(masters_.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      by[owner_[RedisCluster::KeySlot(keys[i])]].push_back(i);
    }
    return by;
  }

  // Pipelined SET keys[i] = values[i], one pipeline per node, nodes one after another;
  // exits unless every answer is OK.
  void Set(const std::vector<std::vector<size_t>>& by_node, const std::vector<std::string>& keys,
           const std::vector<std::span<const std::byte>>& values) {
    for (size_t m = 0; m < masters_.size(); ++m) {
      redisContext* c = masters_[m].get();
      for (size_t i : by_node[m]) {
        const char* argv[] = {"SET", keys[i].data(),
                              reinterpret_cast<const char*>(values[i].data())};
        const size_t lens[] = {3, keys[i].size(), values[i].size()};
        redisAppendCommandArgv(c, 3, argv, lens);
      }
      for (size_t i : by_node[m]) {
        RedisReplyPtr r = Next(c);
        if (r->type != REDIS_REPLY_STATUS) Die("hiredis: SET " + keys[i] + " was not taken");
      }
    }
  }

  // Pipelined GET of keys[i] into dst[i] (each exactly the value's size), the same way;
  // exits unless every value is there with that size.
  void Get(const std::vector<std::vector<size_t>>& by_node, const std::vector<std::string>& keys,
           const std::vector<std::span<std::byte>>& dst) {
    for (size_t m = 0; m < masters_.size(); ++m) {
      redisContext* c = masters_[m].get();
      for (size_t i : by_node[m]) {
        const char* argv[] = {"GET", keys[i].data()};
        const size_t lens[] = {3, keys[i].size()};
        redisAppendCommandArgv(c, 2, argv, lens);
      }
      for (size_t i : by_node[m]) {
        RedisReplyPtr r = Next(c);
        if (r->type != REDIS_REPLY_STRING || r->len != dst[i].size()) {
          Die("hiredis: GET " + keys[i] + " did not return the value");
        }
        std::memcpy(dst[i].data(), r->str, r->len);
      }
    }
  }

  // FLUSHALL SYNC on every master.
  void FlushAll() {
    for (auto& c : masters_) RunOrDie(c.get(), {"FLUSHALL", "SYNC"}, "the store");
  }

 private:
  static RedisReplyPtr Next(redisContext* c) {
    void* r = nullptr;
    if (redisGetReply(c, &r) != REDIS_OK || r == nullptr) Die(std::string("hiredis: ") + c->errstr);
    return RedisReplyPtr(static_cast<redisReply*>(r));
  }

  std::vector<RedisContextPtr> masters_;
  std::vector<uint16_t> owner_;  // slot -> masters_ index
};

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};

// One round's sealed images (a prompt's chunks, payloads of deterministic bytes) and the
// buffers they are read back into, with the tier's and hiredis's views of both.
struct Round {
  Round(uint64_t payload_bytes, size_t n, uint64_t seed)
      : spec(BenchSpec(payload_bytes, "bench-remote-" + std::to_string(payload_bytes))),
        layout(SlotLayout::For(spec)),
        ns(spec.Digest()),
        tokens(UniquePrompt(seed, uint64_t{spec.chunk_tokens} * n)),
        keys(ComputeChunkKeys(ns, tokens, spec.chunk_tokens)),
        src(static_cast<std::byte*>(std::aligned_alloc(4096, n * layout.slot_bytes))),
        dst(static_cast<std::byte*>(std::aligned_alloc(4096, n * layout.slot_bytes))) {
    if (src == nullptr || dst == nullptr) Die("out of memory for the round's images");
    const uint64_t stored = StoredBytes();
    for (size_t i = 0; i < n; ++i) {
      std::byte* slot = src.get() + i * layout.slot_bytes;
      std::memset(slot, 0, layout.header_bytes);
      for (uint64_t b = 0; b < layout.payload_bytes; b += 8) {
        const uint64_t v = (seed + i * layout.payload_bytes + b) * 0x9E3779B97F4A7C15ULL;
        std::memcpy(slot + layout.header_bytes + b, &v, 8);
      }
      const SlotIdentity id = Id(i);
      SealSlot(slot, layout, id, i + 1);
      images.push_back({id.key, id.parent, ns, {slot, layout.slot_bytes}});
      names.push_back(RemoteTier::ImageKey(ns, id.key));
      values.push_back({slot, stored});
      std::byte* out = dst.get() + i * layout.slot_bytes;
      reads.push_back({id, &layout, {out, layout.slot_bytes}, {}});
      outs.push_back({out, stored});
    }
  }
  SlotIdentity Id(size_t i) const {
    return {ns, keys[i], i == 0 ? ns : keys[i - 1],
            std::span<const int32_t>(tokens).subspan(i * spec.chunk_tokens, spec.chunk_tokens)};
  }
  // The bytes of one image in the store: header (with tokens) and payload.
  uint64_t StoredBytes() const { return layout.header_bytes + layout.payload_bytes; }
  // Zeroes what was read; then exits unless each image read is the one written.
  void ClearReads() { std::memset(dst.get(), 0, images.size() * layout.slot_bytes); }
  void CheckReads(const char* who) const {
    for (size_t i = 0; i < images.size(); ++i) {
      if (std::memcmp(values[i].data(), outs[i].data(), outs[i].size()) != 0) {
        Die(std::string(who) + " read back other bytes for " + names[i]);
      }
    }
  }

  NamespaceSpec spec;
  SlotLayout layout;
  NamespaceId ns;
  std::vector<int32_t> tokens;
  std::vector<ChunkKey> keys;
  std::unique_ptr<std::byte, AlignedFree> src, dst;  // n slots each
  std::vector<NvmeImage> images;                     // the tier's writes (whole slots)
  std::vector<RemoteTier::ReadRequest> reads;        // the tier's reads into dst
  std::vector<std::string> names;                    // RemoteTier::ImageKey of each image
  std::vector<std::span<const std::byte>> values;    // hiredis: the stored bytes of each
  std::vector<std::span<std::byte>> outs;            // hiredis: where each GET goes
};

struct Times {
  std::vector<double> put_s, get_s;
  std::vector<double> verify_s;  // the tier's: its checks of the images read, timed again apart
};

// The tier's put and get of the round; exits unless every image is stored and read back
// verified.
void TierRound(RemoteTier& tier, Round& r, Times* t) {
  r.ClearReads();
  const auto t0 = Clock::now();
  const size_t stored = tier.WriteMany(r.images);
  const auto t1 = Clock::now();
  tier.ReadMany(r.reads);
  const auto t2 = Clock::now();
  if (stored != r.images.size()) {
    Die("the remote tier stored " + std::to_string(stored) + " of " +
        std::to_string(r.images.size()) + " images");
  }
  for (const RemoteTier::ReadRequest& q : r.reads) {
    if (!q.result.ok()) Die("the remote tier's read: " + q.result.ToString());
  }
  // What ReadMany spent verifying: its checks of every image read, once more (each image
  // was in cache for its first check as it is here, unless a round outgrows the cache).
  const auto v0 = Clock::now();
  for (const RemoteTier::ReadRequest& q : r.reads) {
    if (!VerifySlotHeader(q.buffer.data(), r.layout, q.id).ok() ||
        !VerifySlotPayload(q.buffer.data(), r.layout).ok()) {
      Die("an image the remote tier verified fails verification");
    }
  }
  const auto v1 = Clock::now();
  r.CheckReads("the remote tier");
  t->put_s.push_back(Seconds(t1 - t0));
  t->get_s.push_back(Seconds(t2 - t1));
  t->verify_s.push_back(Seconds(v1 - v0));
}

void HiredisRound(Hiredis& h, const std::vector<std::vector<size_t>>& by_node, Round& r, Times* t) {
  r.ClearReads();
  const auto t0 = Clock::now();
  h.Set(by_node, r.names, r.values);
  const auto t1 = Clock::now();
  h.Get(by_node, r.names, r.outs);
  const auto t2 = Clock::now();
  r.CheckReads("hiredis");
  t->put_s.push_back(Seconds(t1 - t0));
  t->get_s.push_back(Seconds(t2 - t1));
}

}  // namespace

int RunRemote(const RemoteOptions& o) {
  std::unique_ptr<OwnStore> own;
  std::string url = o.url;
  if (url.empty()) {
    own = std::make_unique<OwnStore>(o.redis_server, o.single);
    url = own->Url();
  }
  Hiredis hiredis(url);
  RemoteTierOptions tier_options;
  tier_options.url = url;
  tier_options.timeout = kTierTimeout;
  if (o.mac) {
    tier_options.mac_key.resize(RemoteTierOptions::kMacKeyBytes);
    std::random_device rd;
    for (char& c : tier_options.mac_key) c = static_cast<char>(rd());
  }
  auto tier = Must(RemoteTier::Open(tier_options), "the remote tier");
  std::printf(
      "kvtier-bench remote: the remote tier vs pipelined hiredis on the same store, "
      "%d rounds per size (after one warm-up), every byte read back checked%s\n",
      o.iterations, o.mac ? "; the tier's images carry a keyed MAC (--mac)" : "");
  std::printf(
      "  store: %s (%s, %zu master%s, %s)\n", url.c_str(),
      own ? (o.single ? "one redis-server started here" : "a Redis Cluster started here") : "given",
      hiredis.num_masters(), hiredis.num_masters() == 1 ? "" : "s",
      own ? "no persistence" : "FLUSHALL between rounds");
  std::printf(
      "  kvtier: RemoteTier::WriteMany of the round's sealed images, then ReadMany into "
      "buffers, each image verified (pool %u, timeout %lld ms)\n",
      tier_options.pool_size, static_cast<long long>(kTierTimeout.count()));
  std::printf(
      "  hiredis: SET then GET of the same bytes under the same keys, one pipeline per "
      "node, nodes one after another, each value copied out of its reply\n");
  std::printf("%-9s %6s %9s %9s %6s %9s %9s %6s %7s\n", "payload", "images", "put kvt", "put hir",
              "ratio", "get kvt", "get hir", "ratio", "verify");
  uint64_t seed = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  for (const auto& [payload, default_chunks] :
       {std::pair{256 * kKiB, 64}, std::pair{kMiB, 32}, std::pair{4 * kMiB, 16}}) {
    const size_t n = static_cast<size_t>(o.num_chunks > 0 ? o.num_chunks : default_chunks);
    Round round(payload, n, ++seed);
    const auto by_node = hiredis.ByNode(round.names);
    Times kv, hr;
    for (int it = -1; it < o.iterations; ++it) {
      Times* kv_t = it >= 0 ? &kv : nullptr;
      Times* hr_t = it >= 0 ? &hr : nullptr;
      Times ignored;
      // Which goes first alternates, so neither always meets the store just flushed.
      for (int side = 0; side < 2; ++side) {
        hiredis.FlushAll();  // untimed: every SET makes a fresh key
        if ((side + it) % 2 == 0) {
          TierRound(*tier, round, kv_t ? kv_t : &ignored);
        } else {
          HiredisRound(hiredis, by_node, round, hr_t ? hr_t : &ignored);
        }
      }
    }
    hiredis.FlushAll();
    const double gb = static_cast<double>(n * round.StoredBytes()) / 1e9;
    const double kp = Percentile(kv.put_s, 50), hp = Percentile(hr.put_s, 50);
    const double kg = Percentile(kv.get_s, 50), hg = Percentile(hr.get_s, 50);
    const double kv_verify = Percentile(kv.verify_s, 50);
    std::printf("%-9s %6zu %9.2f %9.2f %6.2f %9.2f %9.2f %6.2f %6.1f%%\n",
                FormatBytes(payload).c_str(), n, gb / kp, gb / hp, hp / kp, gb / kg, gb / hg,
                hg / kg, 100 * kv_verify / kg);
    std::fflush(stdout);
  }
  std::printf(
      "(GB/s = 1e9 bytes/s of images, header with tokens and payload, over the median "
      "round; ratio = kvtier / hiredis; goal >= 0.8; verify = the tier's checks of the "
      "images read, timed apart, as a share of its median get)\n");
  return 0;
}

}  // namespace kvtier::bench
