// kvtier-bench: throughput and latency of kvtier against a baseline measured in
// the same run, printed as a ratio. Runs against a live kvtierd (--socket).
//
//   kvtier-bench dram    one engine request of 64 chunks (256 KiB, 1 MiB, 4 MiB
//                        payloads): Store then Load through the SDK, vs two
//                        plain memcpys of the same bytes (in and out).
//   kvtier-bench lookup  a 128K-token prompt fully cached in DRAM: Lookup p50/p99
//                        (hashing + RPC + token check), vs hashing alone plus an
//                        empty RPC (Health) in the same run.
//   kvtier-bench memory  1,000,000 chunks of a small namespace: the daemon's
//                        anonymous resident memory (RssAnon) per chunk.
//   kvtier-bench nvme    chunk writes and reads through the NVMe tier vs fio on the
//                        same file, same pattern, block size and depth (nvme.h).
//   kvtier-bench peers   put + get of 256 KiB, 1 MiB, 4 MiB values through the SDK and
//                        through Redis and Mooncake Store started on loopback, in one
//                        run (peers.h).
//   kvtier-bench remote  put + get of 256 KiB, 1 MiB, 4 MiB slot images through the remote
//                        tier vs pipelined hiredis SET/GET on the same Redis Cluster, in
//                        process; the cluster started here or given (remote.h).
//   kvtier-bench evict   making room in a full tier of long prefix chains, in process:
//                        ns per store that evicts vs one into free space (evict.h).
//   kvtier-bench restart time from starting kvtierd to serving with N chunks on
//                        NVMe (default 1,000,000 small chunks), vs starting it
//                        on an empty NVMe tier in the same run.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "evict.h"
#include "kvtier/admin_client.h"
#include "kvtier/client.h"
#include "kvtier/logging.h"
#include "kvtier/tiers/nvme_tier.h"
#include "kvtier/tools/cli_words.h"
#include "kvtier/tools/percentiles.h"
#include "kvtier/tools/synthetic_kv.h"
#include "kvtier/units.h"
#include "nvme.h"
#include "peers.h"
#include "remote.h"
#include "scale.h"

namespace {

using kvtier::tools::Percentile;
using namespace kvtier::bench;  // NOLINT: this file's helpers

int RunDram(const std::string& socket, int iterations, int num_chunks) {
  auto client = ConnectOrDie(socket);
  auto admin = AdminStub(socket);
  const kvtier::DaemonStats stats = Must(admin->Stats(), "Stats RPC");
  const uint64_t arena_bytes = stats.tiers.at(0).capacity_bytes;
  std::printf("kvtier-bench dram: one request of %d chunks, Store then Load, vs memcpy in + out\n",
              num_chunks);
  std::printf("%-10s %10s %12s %12s %12s %12s %8s\n", "payload", "iters", "store GB/s", "load GB/s",
              "kvtier GB/s", "memcpy GB/s", "ratio");
  uint64_t seed = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  for (uint64_t payload : {256 * kvtier::kKiB, kvtier::kMiB, 4 * kvtier::kMiB}) {
    const auto spec = BenchSpec(payload, "bench-dram-" + std::to_string(payload));
    auto ns = Must(client->OpenNamespace(spec), "open namespace");
    const uint64_t bytes = payload * num_chunks;
    if (ns.layout.slot_bytes * num_chunks > arena_bytes) {
      Die("the DRAM arena (" + kvtier::FormatBytes(arena_bytes) + ") cannot hold one request of " +
          kvtier::FormatBytes(ns.layout.slot_bytes * num_chunks) + "; raise --dram-bytes");
    }
    std::vector<std::byte> src(bytes), dst(bytes), mid(bytes);
    for (size_t i = 0; i < bytes; i += 8) {
      const uint64_t v = i * 0x9E3779B97F4A7C15ULL;
      std::memcpy(src.data() + i, &v, 8);
    }
    std::memset(dst.data(), 1, bytes);
    std::memset(mid.data(), 1, bytes);
    // Warm-up: touch every arena page once, so the figures are the steady state.
    const int warmup = static_cast<int>(arena_bytes / (ns.layout.slot_bytes * num_chunks)) + 2;
    std::vector<double> kv_s, store_s, load_s, base_s;
    for (int it = -warmup; it < iterations; ++it) {
      const auto tokens = UniquePrompt(++seed, uint64_t{spec.chunk_tokens} * num_chunks);
      const StoreLoadSeconds kv =
          StoreLoadVerified(*client, ns, tokens, src, dst, static_cast<uint32_t>(num_chunks));
      const auto b0 = Clock::now();
      std::memcpy(mid.data(), src.data(), bytes);
      std::memcpy(dst.data(), mid.data(), bytes);
      const auto b1 = Clock::now();
      if (it < 0) continue;
      store_s.push_back(kv.store);
      load_s.push_back(kv.load);
      kv_s.push_back(kv.store + kv.load);
      base_s.push_back(Seconds(b1 - b0));
    }
    const double gb = static_cast<double>(bytes) / 1e9;
    const double kv = Percentile(kv_s, 50), base = Percentile(base_s, 50);
    std::printf("%-10s %10d %12.2f %12.2f %12.2f %12.2f %8.2f\n",
                kvtier::FormatBytes(payload).c_str(), iterations, gb / Percentile(store_s, 50),
                gb / Percentile(load_s, 50), 2 * gb / kv, 2 * gb / base, base / kv);
  }
  std::printf(
      "(medians; GB/s = 1e9 bytes/s; kvtier and memcpy move the bytes in and out: "
      "ratio = memcpy time / kvtier time; goal >= 0.8)\n");
  return 0;
}

int RunLookup(const std::string& socket, int iterations, uint64_t prompt_tokens) {
  auto client = ConnectOrDie(socket);                               // Lookups over the control ring
  auto grpc_client = ConnectOrDie(socket, /*control_ring=*/false);  // the same over gRPC
  auto admin = AdminStub(socket);
  const kvtier::NamespaceSpec spec = kvtier::bench::LookupSpec("bench-lookup");
  auto ns = Must(client->OpenNamespace(spec), "open namespace");
  auto grpc_ns = Must(grpc_client->OpenNamespace(spec), "open namespace");
  const auto tokens = UniquePrompt(static_cast<uint64_t>(getpid()), prompt_tokens);
  const uint64_t chunks = kvtier::bench::StoreZerosOrDie(*client, ns, tokens);
  const uint64_t ring_before = Must(admin->Stats(), "stats").ring_lookups;
  std::vector<double> lookup_us, grpc_us, hash_us, rpc_us, baseline_hash_us;
  for (int it = 0; it < iterations; ++it) {
    const auto t0 = Clock::now();
    auto r = Must(client->Lookup(ns, tokens), "lookup");
    const auto t1 = Clock::now();
    if (r.num_chunks != chunks) Die("lookup found " + std::to_string(r.num_chunks) + " chunks");
    auto keys = kvtier::Client::ChunkKeys(ns, tokens);
    const auto t2 = Clock::now();
    Must(admin->Health(), "Health RPC");
    const auto t3 = Clock::now();
    if (keys.size() != chunks) Die("hashing gave the wrong number of keys");
    const auto t4 = Clock::now();
    const auto baseline_keys =
        kvtier::ComputeChunkKeys(ns.id, tokens, spec.chunk_tokens, kvtier::HashIsa::kBaseline);
    const auto t5 = Clock::now();
    if (baseline_keys != keys) Die("the baseline hash path gave other keys");
    auto g = Must(grpc_client->Lookup(grpc_ns, tokens), "lookup over gRPC");
    const auto t6 = Clock::now();
    if (g.num_chunks != chunks) Die("lookup over gRPC found " + std::to_string(g.num_chunks));
    baseline_hash_us.push_back(Micros(t5 - t4));
    lookup_us.push_back(Micros(t1 - t0));
    hash_us.push_back(Micros(t2 - t1));
    rpc_us.push_back(Micros(t3 - t2));
    grpc_us.push_back(Micros(t6 - t5));
  }
  // The loop above leaves kvtierd's ring thread idle for a gRPC call between
  // ring Lookups, so each one wakes it from its futex. A scheduler looking up
  // its waiting requests sends them back to back: time that too.
  std::vector<double> burst_us;
  for (int it = 0; it < iterations; ++it) {
    const auto t0 = Clock::now();
    auto r = Must(client->Lookup(ns, tokens), "lookup");
    burst_us.push_back(Micros(Clock::now() - t0));
    if (r.num_chunks != chunks) Die("lookup found " + std::to_string(r.num_chunks) + " chunks");
  }
  const uint64_t ring_calls = Must(admin->Stats(), "stats").ring_lookups - ring_before;
  const double base = Percentile(hash_us, 50) + Percentile(rpc_us, 50);
  std::printf("kvtier-bench lookup: %llu-token prompt, %llu chunks cached in DRAM, %d lookups\n",
              static_cast<unsigned long long>(prompt_tokens),
              static_cast<unsigned long long>(chunks), iterations);
  std::printf("  ring Lookups of both loops that went over the ring: %llu of %d\n",
              static_cast<unsigned long long>(ring_calls), 2 * iterations);
  std::printf(
      "  Lookup, control ring, mixed loop  p50 %8.1f us   p99 %8.1f us   (goal p50 <= %s)\n",
      Percentile(lookup_us, 50), Percentile(lookup_us, 99),
      prompt_tokens >= 65536 ? "150 us" : "20 us at 2K tokens");
  std::printf(
      "  Lookup, control ring, back to back p50 %8.1f us   p99 %8.1f us   (no gRPC call between)\n",
      Percentile(burst_us, 50), Percentile(burst_us, 99));
  std::printf(
      "  Lookup, gRPC                      p50 %8.1f us   p99 %8.1f us   (ratio ring/gRPC p50 "
      "%.2f)\n",
      Percentile(grpc_us, 50), Percentile(grpc_us, 99),
      Percentile(lookup_us, 50) / Percentile(grpc_us, 50));
  std::printf("  baseline: XXH3 keys alone           p50 %8.1f us   (%s path; goal <= 15 us)\n",
              Percentile(hash_us, 50), kvtier::HashIsaName(kvtier::BestHashIsa()));
  std::printf("  baseline: XXH3 keys, SSE2 path      p50 %8.1f us   (ratio %.2f)\n",
              Percentile(baseline_hash_us, 50),
              Percentile(baseline_hash_us, 50) / Percentile(hash_us, 50));
  std::printf("  baseline: empty RPC (Health)        p50 %8.1f us\n", Percentile(rpc_us, 50));
  std::printf("  ratio ring Lookup p50 / (hash + empty RPC) = %.2f\n",
              Percentile(lookup_us, 50) / base);
  if (ring_calls != 2 * static_cast<uint64_t>(iterations)) {
    std::printf(
        "  NOTE: %llu of %d ring-client Lookups went over the control ring (the rest fell back to "
        "gRPC)\n",
        static_cast<unsigned long long>(ring_calls), 2 * iterations);
  }
  return 0;
}

// RssAnon of `pid` in bytes, from /proc/<pid>/status.
uint64_t RssAnonBytes(uint32_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  }
  Die("cannot read RssAnon of pid " + std::to_string(pid) + " (is kvtierd on this machine?)");
}

int RunMemory(const std::string& socket, uint64_t num_chunks) {
  auto client = ConnectOrDie(socket);
  auto admin = AdminStub(socket);
  kvtier::NamespaceSpec spec;  // 16 tokens of 64 B: 1 KiB payload, one 4 KiB slot
  spec.model_id = "bench-memory";
  spec.num_layers = 1;
  spec.num_kv_heads = 1;
  spec.head_dim = 16;
  spec.chunk_tokens = 16;
  auto ns = Must(client->OpenNamespace(spec), "open namespace");
  const kvtier::DaemonHealth health = Must(admin->Health(), "Health RPC");
  const kvtier::DaemonStats stats = Must(admin->Stats(), "Stats RPC");
  const kvtier::TierStats* dram = nullptr;
  for (const kvtier::TierStats& t : stats.tiers) {
    if (t.name == "dram") dram = &t;
  }
  if (dram == nullptr) Die("kvtierd's stats have no dram tier");
  if (dram->write_bytes > 0 || dram->chunks > 0) {
    // The index keeps what it grew to: on a used daemon the figure means nothing.
    Die("kvtierd has stored chunks already (" + std::to_string(dram->chunks) +
        " in DRAM now); memory needs a fresh kvtierd");
  }
  const uint64_t capacity = dram->capacity_bytes / ns.layout.slot_bytes;
  if (capacity < num_chunks) {
    const uint64_t mib = (num_chunks * ns.layout.slot_bytes + kvtier::kMiB - 1) / kvtier::kMiB;
    Die("the arena holds " + std::to_string(capacity) + " chunks of this namespace, fewer than " +
        std::to_string(num_chunks) + "; start kvtierd with --dram-bytes " + std::to_string(mib) +
        "MiB or more");
  }
  const uint64_t before = RssAnonBytes(health.pid);
  const uint64_t per_request = 1024;  // chunks per Store call
  uint64_t stored = 0, seed = 7;
  const auto t0 = Clock::now();
  while (stored < num_chunks) {
    const uint64_t n = std::min(per_request, num_chunks - stored);
    const auto tokens = UniquePrompt(++seed, n * spec.chunk_tokens);
    auto st = Must(client->Store(ns, tokens,
                                 [](size_t i, std::span<std::byte> p) {
                                   std::memset(p.data(), static_cast<int>(i), p.size());
                                   return kvtier::Status::Ok();
                                 }),
                   "store");
    if (st.stored_chunks != n) {
      Die("stored " + std::to_string(st.stored_chunks) + " of " + std::to_string(n) + " chunks (" +
          std::to_string(st.dropped_chunks) +
          " dropped, fail-open: " + (st.fail_open.ok() ? "no" : st.fail_open.ToString()) + ")");
    }
    stored += n;
  }
  const double secs = Seconds(Clock::now() - t0);
  const uint64_t after = RssAnonBytes(health.pid);
  const double per_chunk = static_cast<double>(after - before) / static_cast<double>(num_chunks);
  std::printf("kvtier-bench memory: %llu chunks of 16 tokens x 64 B indexed in %.1f s\n",
              static_cast<unsigned long long>(num_chunks), secs);
  std::printf("  kvtierd RssAnon before %s, after %s\n", kvtier::FormatBytes(before).c_str(),
              kvtier::FormatBytes(after).c_str());
  std::printf("  anonymous memory per chunk: %.1f bytes (goal <= 256; ratio to goal %.2f)\n",
              per_chunk, per_chunk / 256.0);
  return 0;
}

// Seconds from spawning `argv` until `kvtierctl health` (AdminClient) answers.
double SecondsToServing(const std::vector<std::string>& argv, const std::string& socket,
                        pid_t* pid_out) {
  const auto t0 = Clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  *pid_out = pid;
  for (;;) {
    if (auto admin = kvtier::AdminClient::Connect(socket, std::chrono::milliseconds(200));
        admin.ok() && (*admin)->Health().ok()) {
      return Seconds(Clock::now() - t0);
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) Die("kvtierd exited during start-up");
    if (Seconds(Clock::now() - t0) > 600) Die("kvtierd did not serve within 600 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void StopDaemon(pid_t pid) {
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
}

// The folder RunRestart made, removed at exit however the run ends (Die, a
// failed start, SIGINT or SIGTERM: they end the fill at its next batch).
std::string restart_folder;
volatile std::sig_atomic_t restart_interrupted = 0;

// Works in a folder of its own made inside `parent` (created when missing),
// and removes only that: `--dir` may be a folder that holds other files.
int RunRestart(const std::string& kvtierd, const std::string& parent, uint64_t num_chunks) {
  namespace fs = std::filesystem;
  if (access(kvtierd.c_str(), X_OK) != 0) {
    Die("--kvtierd " + kvtierd + ": " + std::strerror(errno) + " (the kvtierd binary to start)");
  }
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) Die("--dir " + parent + ": " + ec.message());
  std::string made = parent + "/kvtier-bench-restart.XXXXXX";
  if (mkdtemp(made.data()) == nullptr) Die("--dir " + parent + ": " + std::strerror(errno));
  const std::string dir = made;
  restart_folder = made;
  std::atexit([] {
    std::error_code ignored;
    if (!restart_folder.empty()) std::filesystem::remove_all(restart_folder, ignored);
  });
  for (int sig : {SIGINT, SIGTERM}) {
    std::signal(sig, [](int) { restart_interrupted = 1; });
  }
  kvtier::NamespaceSpec spec;  // 16 tokens x 64 B: 1 KiB payload, 4 KiB slots
  spec.model_id = "bench-restart";
  spec.num_layers = 1;
  spec.num_kv_heads = 1;
  spec.head_dim = 16;
  spec.chunk_tokens = 16;
  const kvtier::SlotLayout layout = kvtier::SlotLayout::For(spec);
  const kvtier::NamespaceId ns = spec.Digest();
  const uint64_t nvme_bytes = kvtier::AlignUp(num_chunks * layout.slot_bytes * 11 / 10, 4096);
  fs::create_directories(dir + "/nvme");
  fs::create_directories(dir + "/empty");
  const auto f0 = Clock::now();
  {
    kvtier::NvmeTierOptions o;
    o.paths = {dir + "/nvme"};
    o.bytes_per_path = nvme_bytes;
    auto tier = Must(kvtier::NvmeTier::Open(o), "open NVMe tier");
    constexpr size_t kBatch = 4096;
    std::unique_ptr<std::byte, decltype(&std::free)> images(
        static_cast<std::byte*>(std::aligned_alloc(4096, kBatch * layout.slot_bytes)), &std::free);
    std::memset(images.get(), 0x5A, kBatch * layout.slot_bytes);
    for (uint64_t first = 0; first < num_chunks; first += kBatch) {
      if (restart_interrupted) Die("interrupted; removing " + dir);
      const size_t n = std::min<uint64_t>(kBatch, num_chunks - first);
      std::vector<kvtier::NvmeImage> batch;
      for (size_t i = 0; i < n; ++i) {
        const auto tokens = UniquePrompt(first + i + 1, spec.chunk_tokens);
        const kvtier::ChunkKey key = kvtier::ComputeChunkKey(ns, tokens);
        std::byte* slot = images.get() + i * layout.slot_bytes;
        kvtier::SealSlot(slot, layout, {ns, key, ns, tokens}, first + i + 1);
        batch.push_back({key, ns, ns, {slot, layout.slot_bytes}});
      }
      if (Must(tier->Write(batch), "NVMe write") != n) Die("the NVMe tier did not store a batch");
    }
  }
  const double fill_s = Seconds(Clock::now() - f0);
  const std::string socket = dir + "/kvtierd.sock";
  const auto start = [&](const std::string& path) {
    pid_t pid = 0;
    const double s =
        SecondsToServing({kvtierd, "--socket", socket, "--dram-bytes", "64MiB", "--nvme-path", path,
                          "--nvme-bytes", std::to_string(nvme_bytes), "--log-level", "warn"},
                         socket, &pid);
    StopDaemon(pid);
    return s;
  };
  const double empty_s = start(dir + "/empty");
  const double full_s = start(dir + "/nvme");
  fs::remove_all(dir);
  std::printf("kvtier-bench restart: %llu NVMe chunks (4 KiB slots) written in %.1f s\n",
              static_cast<unsigned long long>(num_chunks), fill_s);
  std::printf("  kvtierd start to serving, empty NVMe tier   %8.3f s\n", empty_s);
  std::printf(
      "  kvtierd start to serving, %llu chunks  %8.3f s   (goal <= 3 s; ratio to empty %.1f)\n",
      static_cast<unsigned long long>(num_chunks), full_s, full_s / empty_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kvtier::LogToStderr("kvtier-bench");  // results go to stdout; logs, the SDK's too, to stderr
  // A peer (redis-server) that goes away mid-run: an error from the write, not SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  std::string socket;
  int iterations = 15, num_chunks = 64, lookup_iterations = 300;
  uint64_t prompt_tokens = 131072, memory_chunks = 1000000;
  CLI::App app{"kvtier-bench: kvtier benchmarks with same-run baselines", "kvtier-bench"};
  app.add_option("--socket", socket, "kvtierd socket (dram, lookup, memory, peers, scale)");
  app.require_subcommand(1);
  app.fallthrough();  // --socket may follow the subcommand too
  auto* dram = app.add_subcommand("dram", "Store + Load through the SDK vs memcpy in + out");
  dram->add_option("--iterations", iterations, "measured requests per payload size")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  dram->add_option("--chunks", num_chunks, "chunks per request")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  auto* lookup = app.add_subcommand("lookup", "Lookup latency of a long cached prompt");
  lookup->add_option("--iterations", lookup_iterations, "lookups")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  lookup->add_option("--prompt-tokens", prompt_tokens, "prompt length (at least one chunk, 256)")
      ->check(CLI::Range(uint64_t{256}, uint64_t{1} << 22))
      ->capture_default_str();
  auto* memory = app.add_subcommand("memory", "daemon anonymous memory per indexed chunk");
  memory->add_option("--chunks", memory_chunks, "chunks to index")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  std::string nvme_dir = "./kvtier-bench-nvme";
  std::string nvme_file_bytes = "1GiB";
  int fio_seconds = 3;
  bool nvme_plain_buffers = false;
  std::string restart_kvtierd, restart_dir = "./kvtier-bench-restart";
  uint64_t restart_chunks = 1000000;
  auto* restart = app.add_subcommand("restart", "kvtierd start-to-serving with N NVMe chunks");
  restart->add_option("--kvtierd", restart_kvtierd, "path of the kvtierd binary")->required();
  restart
      ->add_option("--dir", restart_dir,
                   "where to make a folder for the NVMe files (that folder is removed afterwards)")
      ->capture_default_str();
  restart->add_option("--chunks", restart_chunks, "chunks on NVMe")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  auto* nvme = app.add_subcommand("nvme", "NVMe tier chunk I/O vs fio on the same file");
  nvme->add_option("--dir", nvme_dir,
                   "directory for the test file and its index (those two removed afterwards)")
      ->capture_default_str();
  nvme->add_option("--file-bytes", nvme_file_bytes, "test file size, e.g. 1GiB (at least 64MiB)")
      ->capture_default_str();
  nvme->add_option("--fio-seconds", fio_seconds,
                   "fio runtime per measurement, and the least time the tier reads for")
      ->check(CLI::Range(1, 600))
      ->capture_default_str();
  nvme->add_flag("--plain-buffers", nvme_plain_buffers,
                 "do not register buffers with io_uring (neither the tier nor fio)");
  kvtier::bench::PeersOptions peers_options;
  auto* peers = app.add_subcommand("peers", "put + get vs Redis on loopback, same run");
  peers->add_option("--redis-server", peers_options.redis_server, "redis-server binary")
      ->capture_default_str();
  peers->add_option("--mooncake-python", peers_options.mooncake_python,
                    "python with mooncake-transfer-engine-non-cuda (default: the peers venv)");
  peers->add_option("--iterations", peers_options.iterations, "measured rounds per value size")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  peers->add_option("--chunks", peers_options.num_chunks, "values per round")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  kvtier::bench::RemoteOptions remote_options;
  auto* remote = app.add_subcommand("remote", "remote tier put + get vs hiredis, same cluster");
  remote->add_option("--remote", remote_options.url,
                     "redis://host:port[,...] of a store to use (flushed!); default: start a "
                     "3-master cluster on loopback");
  remote->add_flag("--single", remote_options.single, "start one plain redis-server instead");
  remote->add_option("--redis-server", remote_options.redis_server, "redis-server binary")
      ->capture_default_str();
  remote->add_option("--iterations", remote_options.iterations, "measured rounds per size")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  remote
      ->add_option("--chunks", remote_options.num_chunks,
                   "images per round (default 64, 32, 16 for 256 KiB, 1 MiB, 4 MiB)")
      ->check(CLI::Range(1, 1 << 16));
  remote->add_flag("--mac", remote_options.mac,
                   "the tier's images with a keyed MAC (a random key), as --remote-key-file");
  uint64_t evict_chunks = 262144, evict_chain = 256;
  auto* evict = app.add_subcommand("evict", "making room in a full tier of long prefix chains");
  evict->add_option("--chunks", evict_chunks, "slots in the tier")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 28))
      ->capture_default_str();
  evict->add_option("--chain-length", evict_chain, "chunks per prompt")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20))
      ->capture_default_str();
  int scale_clients = 8;
  double scale_seconds = 5;
  uint64_t scale_tokens = 2048;
  auto* scale = app.add_subcommand("scale", "Lookups from N concurrent clients vs one, same run");
  scale->add_option("--clients", scale_clients, "concurrent clients (sessions)")
      ->check(CLI::Range(2, 256))
      ->capture_default_str();
  scale->add_option("--seconds", scale_seconds, "seconds per phase")
      ->check(CLI::Range(0.1, 600.0))
      ->capture_default_str();
  scale->add_option("--prompt-tokens", scale_tokens, "prompt length (at least one chunk, 256)")
      ->check(CLI::Range(uint64_t{256}, uint64_t{1} << 22))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (kvtier::tools::ReportUnplacedWord(app, "kvtier-bench")) return 2;
    return app.exit(e) == 0 ? 0 : 2;  // --help exits 0; usage errors exit 2
  }
  if (evict->parsed()) return kvtier::bench::RunEvict(evict_chunks, evict_chain);
  if (remote->parsed()) {
    if (!remote_options.url.empty() && remote_options.single) {
      std::fprintf(stderr, "kvtier-bench: remote: --single starts a store; --remote names one\n");
      return 2;
    }
    return kvtier::bench::RunRemote(remote_options);
  }
  if (restart->parsed()) return RunRestart(restart_kvtierd, restart_dir, restart_chunks);
  if (nvme->parsed()) {
    auto bytes = kvtier::ParseBytes(nvme_file_bytes);
    if (!bytes.ok() || *bytes < (uint64_t{64} << 20)) {
      std::fprintf(stderr, "kvtier-bench: --file-bytes: %s\n",
                   bytes.ok() ? "at least 64MiB" : bytes.status().message().c_str());
      return 2;
    }
    return kvtier::bench::RunNvme(nvme_dir, *bytes & ~uint64_t{4095}, fio_seconds,
                                  nvme_plain_buffers);
  }
  if (socket.empty()) {
    std::fprintf(stderr, "kvtier-bench: --socket is required for this benchmark\n");
    return 2;
  }
  if (dram->parsed()) return RunDram(socket, iterations, num_chunks);
  if (peers->parsed()) {
    peers_options.socket = socket;
    return kvtier::bench::RunPeers(peers_options);
  }
  if (lookup->parsed()) return RunLookup(socket, lookup_iterations, prompt_tokens);
  if (scale->parsed()) {
    return kvtier::bench::RunScale(socket, scale_clients, scale_seconds, scale_tokens);
  }
  return RunMemory(socket, memory_chunks);
}
