// kvtier-bench peers: put and get of 256 KiB, 1 MiB and 4 MiB values through the kvtier
// SDK and through peers started here on loopback, side by side in one run (peers.h).
#include "peers.h"

#include <hiredis/hiredis.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <utility>

#include "bench_common.h"
#include "kvtier/slot_image.h"
#include "kvtier/tools/percentiles.h"
#include "kvtier/units.h"
#include "redis_process.h"

namespace kvtier::bench {
namespace {

using tools::Percentile;

// redis-server on 127.0.0.1, without persistence, for the benchmark's lifetime; and one
// hiredis connection to it.
class RedisPeer {
 public:
  // nullopt (with `why`) when redis-server cannot be started.
  static std::optional<RedisPeer> Start(const std::string& binary, std::string* why) {
    auto process = RedisProcess::Start(binary, {}, why);
    if (process == nullptr) return std::nullopt;
    RedisContextPtr ctx = ConnectRedisOrDie("127.0.0.1", process->port(), "Redis");
    return RedisPeer(std::move(process), std::move(ctx));
  }

  // Pipelined SET of each value under `keys`; exits unless every reply is OK.
  void Put(const std::vector<std::string>& keys, std::span<const std::byte> values) {
    const size_t each = values.size() / keys.size();
    for (size_t i = 0; i < keys.size(); ++i) {
      redisAppendCommand(ctx_.get(), "SET %b %b", keys[i].data(), keys[i].size(),
                         values.data() + i * each, each);
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      RedisReplyPtr r = Next();
      if (r->type != REDIS_REPLY_STATUS) {
        Die("redis SET " + keys[i] + " failed" +
            (r->type == REDIS_REPLY_ERROR ? ": " + std::string(r->str, r->len) : std::string()));
      }
    }
  }
  // Pipelined GET of `keys` into `out` (value i at i * out.size() / keys.size()); exits
  // unless every value is there with its size.
  void Get(const std::vector<std::string>& keys, std::span<std::byte> out) {
    const size_t each = out.size() / keys.size();
    for (const auto& k : keys) redisAppendCommand(ctx_.get(), "GET %b", k.data(), k.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      RedisReplyPtr r = Next();
      if (r->type != REDIS_REPLY_STRING || r->len != each) Die("redis GET " + keys[i] + " failed");
      std::memcpy(out.data() + i * each, r->str, each);
    }
  }
  void FlushAll() {
    RedisReplyPtr r(static_cast<redisReply*>(redisCommand(ctx_.get(), "FLUSHALL SYNC")));
  }

 private:
  RedisPeer(std::unique_ptr<RedisProcess> process, RedisContextPtr ctx)
      : process_(std::move(process)), ctx_(std::move(ctx)) {}
  RedisReplyPtr Next() {
    void* r = nullptr;
    if (redisGetReply(ctx_.get(), &r) != REDIS_OK || r == nullptr) {
      Die(std::string("redis: ") + ctx_->errstr);
    }
    return RedisReplyPtr(static_cast<redisReply*>(r));
  }

  std::unique_ptr<RedisProcess> process_;
  RedisContextPtr ctx_;  // declared after process_: closed before the server stops
};

struct PutGet {
  std::vector<double> put_s, get_s;
  double PutGbps(double gb) const { return gb / Percentile(put_s, 50); }
  double GetGbps(double gb) const { return gb / Percentile(get_s, 50); }
  // Both ways: 2 * bytes over the median put + get.
  double BothGbps(double gb) const {
    std::vector<double> sum(put_s.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = put_s[i] + get_s[i];
    return 2 * gb / Percentile(sum, 50);
  }
};

// tools/install-python-envs.sh's `peers` venv (the same rule as that script).
std::string PeersVenvPython() {
  std::string root;
  if (const char* v = std::getenv("KVTIER_VENV_ROOT"); v != nullptr && *v != '\0') {
    root = v;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    root = std::string(x) + "/kvtier/venvs";
  } else {
    const char* home = std::getenv("HOME");
    root = std::string(home != nullptr ? home : "") + "/.cache/kvtier/venvs";
  }
  return root + "/peers/bin/python";
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Mooncake Store's rounds, per value size, from mooncake_peer.py run by `python` (it starts
// and stops its master). Exits, with the script's last words, when it fails.
std::map<uint64_t, PutGet> RunMooncake(const std::string& python, const uint64_t (&values)[3],
                                       int num_chunks, int iterations) {
  std::string list;
  for (uint64_t v : values) list += (list.empty() ? "" : ",") + std::to_string(v);
  // The script's stderr (Mooncake's glog lines and its own last words) goes to a file made
  // here, not to a guessable name.
  std::string err =
      std::filesystem::temp_directory_path().string() + "/kvtier-bench-mooncake.XXXXXX";
  const int err_fd = mkstemp(err.data());
  if (err_fd < 0) Die("Mooncake Store: mkstemp: " + std::string(std::strerror(errno)));
  close(err_fd);
  // exec: python replaces the shell, so it is kvtier-bench's child and goes with it
  // (the script asks for SIGTERM when its parent dies; its master goes with the script).
  const std::string cmd = "exec " + ShellQuote(python) + " " +
                          ShellQuote(KVTIER_MOONCAKE_PEER_SCRIPT) + " --values " + list +
                          " --chunks " + std::to_string(num_chunks) + " --iterations " +
                          std::to_string(iterations) + " 2>" + ShellQuote(err);
  FILE* out = popen(cmd.c_str(), "r");
  if (out == nullptr) Die("Mooncake Store: popen: " + std::string(std::strerror(errno)));
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), out)) > 0;) text.append(buf, n);
  const int status = pclose(out);
  std::string why;
  {
    std::ifstream in(err);
    // The script's own words start with "mooncake_peer: "; failing that, the last line
    // (Mooncake's glog or a Python traceback).
    std::string last;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("mooncake_peer: ", 0) == 0) why = line;
      if (!line.empty()) last = line;
    }
    if (why.empty()) why = last;
  }
  std::filesystem::remove(err);
  if (status != 0) {
    Die("Mooncake Store (" + python + " " + KVTIER_MOONCAKE_PEER_SCRIPT + ") failed" +
        (why.empty() ? std::string() : ": " + why));
  }
  std::map<uint64_t, PutGet> rows;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("value")) Die("Mooncake Store: unreadable line: " + line);
    PutGet& r = rows[j["value"].get<uint64_t>()];
    r.put_s = j["put_s"].get<std::vector<double>>();
    r.get_s = j["get_s"].get<std::vector<double>>();
  }
  for (uint64_t v : values) {
    if (rows[v].put_s.size() != static_cast<size_t>(iterations)) {
      Die("Mooncake Store: no rounds of " + FormatBytes(v) + " values in its output");
    }
  }
  return rows;
}

}  // namespace

int RunPeers(const PeersOptions& o) {
  auto client = ConnectOrDie(o.socket);
  const uint64_t arena_bytes =
      Must(AdminStub(o.socket)->Stats(), "Stats RPC").tiers.at(0).capacity_bytes;
  constexpr uint64_t kValues[] = {256 * kKiB, kMiB, 4 * kMiB};
  for (uint64_t value : kValues) {  // before anything is started or allocated
    const uint64_t round = SlotLayout::For(BenchSpec(value, "check")).slot_bytes * o.num_chunks;
    if (round > arena_bytes) {
      Die("the DRAM arena (" + FormatBytes(arena_bytes) + ") cannot hold one round of " +
          std::to_string(o.num_chunks) + " values of " + FormatBytes(value) + " (" +
          FormatBytes(round) +
          "); raise kvtierd's --dram-bytes (and --session-max-bytes, by "
          "default half of it) or lower --chunks");
    }
  }
  std::string redis_why;
  std::optional<RedisPeer> redis = RedisPeer::Start(o.redis_server, &redis_why);
  if (!redis) {
    Die("Redis, the baseline: " + redis_why +
        "; install redis-server (make deps does) or pass --redis-server PATH");
  }
  std::printf(
      "kvtier-bench peers: put then get of %d values per round, %d rounds per size, "
      "bytes verified, every peer on this machine\n",
      o.num_chunks, o.iterations);
  std::printf("  kvtier: SDK Store + Load of one request's chunks (kvtierd at %s)\n",
              o.socket.c_str());
  std::printf(
      "  Redis: %s on 127.0.0.1, no persistence; pipelined SET then GET through "
      "hiredis, each value copied out of its reply\n",
      o.redis_server.c_str());
  const std::string mooncake_python =
      o.mooncake_python.empty() ? PeersVenvPython() : o.mooncake_python;
  std::map<uint64_t, PutGet> mooncake;
  // A venv whose install failed half-way has its python but no mooncake_master.
  const std::string mooncake_master =
      std::filesystem::path(mooncake_python).parent_path().string() + "/mooncake_master";
  if (access(mooncake_python.c_str(), X_OK) == 0 && access(mooncake_master.c_str(), X_OK) == 0) {
    std::printf(
        "  Mooncake Store: mooncake_master on 127.0.0.1 and one client mounting its "
        "segment (TCP transport); batch_put_from then batch_get_into, registered buffers "
        "(%s)\n",
        mooncake_python.c_str());
    std::fflush(stdout);
    mooncake = RunMooncake(mooncake_python, kValues, o.num_chunks, o.iterations);
  } else {
    std::printf(
        "  Mooncake Store: not run (no %s; tools/install-python-envs.sh peers makes it, "
        "or pass --mooncake-python)\n",
        mooncake_master.c_str());
  }
  std::printf(
      "  LMCache: not run (its package needs torch with CUDA, not in this project's "
      "CPU venvs)\n");
  std::printf("%-9s %-8s %9s %9s %10s %12s\n", "value", "system", "put GB/s", "get GB/s",
              "both GB/s", "kvtier / it");
  uint64_t seed = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  for (uint64_t value : kValues) {
    const auto spec = BenchSpec(value, "bench-peers-" + std::to_string(value));
    auto ns = Must(client->OpenNamespace(spec), "open namespace");
    const uint64_t bytes = value * static_cast<uint64_t>(o.num_chunks);
    std::vector<std::byte> src(bytes), dst(bytes);
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
      const uint64_t v = (i + seed) * 0x9E3779B97F4A7C15ULL;
      std::memcpy(src.data() + i, &v, 8);
    }
    // Warm-up rounds, not counted: kvtier's until every arena page was touched once (the
    // steady state of a running daemon, as in `dram`), Redis's once.
    const int warmup = static_cast<int>(arena_bytes / (ns.layout.slot_bytes * o.num_chunks)) + 2;
    PutGet kv, rd;
    for (int it = -warmup; it < o.iterations; ++it) {
      const auto tokens = UniquePrompt(++seed, uint64_t{spec.chunk_tokens} * o.num_chunks);
      std::memset(dst.data(), 0, bytes);
      const StoreLoadSeconds s =
          StoreLoadVerified(*client, ns, tokens, src, dst, static_cast<uint32_t>(o.num_chunks));
      if (it >= 0) kv.put_s.push_back(s.store), kv.get_s.push_back(s.load);
      if (it < -1) continue;
      std::vector<std::string> keys;
      for (int i = 0; i < o.num_chunks; ++i) {
        keys.push_back("kvtier-bench:" + std::to_string(seed) + ":" + std::to_string(i));
      }
      std::memset(dst.data(), 0, bytes);
      const auto t0 = Clock::now();
      redis->Put(keys, src);
      const auto t1 = Clock::now();
      redis->Get(keys, dst);
      const auto t2 = Clock::now();
      if (std::memcmp(src.data(), dst.data(), bytes) != 0) Die("Redis returned other bytes");
      redis->FlushAll();  // untimed: each round starts from an empty server
      if (it >= 0) rd.put_s.push_back(Seconds(t1 - t0)), rd.get_s.push_back(Seconds(t2 - t1));
    }
    const double gb = static_cast<double>(bytes) / 1e9;
    std::printf("%-9s %-8s %9.2f %9.2f %10.2f %12s\n", FormatBytes(value).c_str(), "kvtier",
                kv.PutGbps(gb), kv.GetGbps(gb), kv.BothGbps(gb), "-");
    std::printf("%-9s %-8s %9.2f %9.2f %10.2f %12.2f\n", FormatBytes(value).c_str(), "Redis",
                rd.PutGbps(gb), rd.GetGbps(gb), rd.BothGbps(gb), kv.BothGbps(gb) / rd.BothGbps(gb));
    if (auto m = mooncake.find(value); m != mooncake.end()) {
      const PutGet& mc = m->second;
      std::printf("%-9s %-8s %9.2f %9.2f %10.2f %12.2f\n", FormatBytes(value).c_str(), "Mooncake",
                  mc.PutGbps(gb), mc.GetGbps(gb), mc.BothGbps(gb),
                  kv.BothGbps(gb) / mc.BothGbps(gb));
    }
  }
  std::printf(
      "(medians; GB/s = 1e9 bytes/s of values; both = 2 x bytes over the median put + "
      "get time; goal vs Redis at 1 MiB >= 10)\n");
  return 0;
}

}  // namespace kvtier::bench
