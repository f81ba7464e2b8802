#include "replay.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>

#include "kvtier/socket_path.h"
#include "kvtier/tools/model_presets.h"
#include "kvtier/tools/synthetic_kv.h"

namespace kvtier::replay {
namespace {

using Clock = std::chrono::steady_clock;

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

}  // namespace

void Totals::Add(const Totals& o) {
  requests += o.requests;
  prompt_tokens += o.prompt_tokens;
  hit_tokens += o.hit_tokens;
  bytes_loaded += o.bytes_loaded;
  bytes_stored += o.bytes_stored;
  chunks_loaded += o.chunks_loaded;
  chunks_stored += o.chunks_stored;
  chunks_dropped += o.chunks_dropped;
  verify_errors += o.verify_errors;
  fail_open += o.fail_open;
  nvme_hit_tokens += o.nvme_hit_tokens;
  nvme_bytes_loaded += o.nvme_bytes_loaded;
  remote_hit_tokens += o.remote_hit_tokens;
  remote_bytes_loaded += o.remote_bytes_loaded;
  prefetch_nvme_chunks += o.prefetch_nvme_chunks;
  prefetch_ready_chunks += o.prefetch_ready_chunks;
  lookup_us.insert(lookup_us.end(), o.lookup_us.begin(), o.lookup_us.end());
  load_us.insert(load_us.end(), o.load_us.begin(), o.load_us.end());
  store_us.insert(store_us.end(), o.store_us.begin(), o.store_us.end());
  start_lag_us.insert(start_lag_us.end(), o.start_lag_us.begin(), o.start_lag_us.end());
}

std::string NewRunId() {
  return "replay-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}()) + "-";
}

RequestRunner::RequestRunner(const ReplayOptions& options, std::unique_ptr<Client> client,
                             NamespaceHandle ns, uint32_t num_layers)
    : options_(options), client_(std::move(client)), ns_(std::move(ns)), num_layers_(num_layers) {
  prefetch_.policy = options.prefetch == "wait_complete" ? PrefetchPolicy::kWaitComplete
                     : options.prefetch == "timeout"     ? PrefetchPolicy::kTimeout
                                                         : PrefetchPolicy::kBestEffort;
}

std::unique_ptr<RequestRunner> RequestRunner::Create(const ReplayOptions& options, int* exit_code) {
  auto spec = tools::ModelPreset(options.model, options.chunk_tokens);
  if (!spec.ok()) {
    std::fprintf(stderr, "kvtier-replay: %s\n", spec.status().message().c_str());
    *exit_code = 2;
    return nullptr;
  }
  ClientOptions copts;
  copts.socket_path = options.socket_path;
  copts.deadline = options.deadline;
  copts.client_name = "kvtier-replay";
  auto client = Client::Connect(copts);
  if (!client.ok()) {  // a path that is no socket, say: unreachable, as for kvtierctl
    std::fprintf(stderr, "kvtier-replay: %s\n", client.status().message().c_str());
    *exit_code = 1;
    return nullptr;
  }
  if (!(*client)->connected()) {
    const std::string where =
        options.socket_path.empty() ? DefaultSocketPath() : options.socket_path;
    std::fprintf(stderr, "kvtier-replay: kvtierd is not reachable at %s\n", where.c_str());
    *exit_code = 1;
    return nullptr;
  }
  auto ns = (*client)->OpenNamespace(*spec);
  if (!ns.ok()) {
    std::fprintf(stderr, "kvtier-replay: %s\n", ns.status().message().c_str());
    *exit_code = 2;
    return nullptr;
  }
  return std::unique_ptr<RequestRunner>(
      new RequestRunner(options, std::move(client).value(), *ns, spec->num_layers));
}

std::vector<ChunkKey> RequestRunner::ChunkKeysOf(const tools::TraceRequest& req) const {
  return Client::ChunkKeys(ns_, tools::SynthesizePrompt(req.hash_ids, req.input_length));
}

bool RequestRunner::Run(const tools::TraceRequest& req, const std::string& request_id, Totals& t) {
  const bool prefetching = options_.prefetch != "off";
  const uint32_t chunk_tokens = options_.chunk_tokens;
  const uint64_t pb = ns_.layout.payload_bytes;
  const std::vector<int32_t> tokens = tools::SynthesizePrompt(req.hash_ids, req.input_length);
  const std::vector<ChunkKey> keys = Client::ChunkKeys(ns_, tokens);
  // Verify in place, inside the lease (no staging buffer: a llama3-8b prompt
  // of the trace holds up to 15 GiB of KV). The verification time is taken
  // out of the load latency; only chunks Load reports valid are counted.
  chunk_errors_.assign(keys.size(), 0);
  PrefetchTicket ticket;
  if (prefetching) {
    auto issued = client_->Prefetch(ns_, tokens, prefetch_, request_id);
    if (!issued.ok()) {
      std::fprintf(stderr, "\nkvtier-replay: prefetch: %s\n", issued.status().ToString().c_str());
      return false;
    }
    ticket = *issued;
    if (!ticket.fail_open.ok()) ++t.fail_open;
    t.prefetch_nvme_chunks += ticket.nvme_chunks;
  }
  if (options_.schedule_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.schedule_delay_ms));
  }
  Clock::duration verify_time{};
  const auto l0 = Clock::now();
  auto load = client_->Load(
      ns_, tokens,
      [&](size_t i, std::span<const std::byte> payload) {
        const auto v0 = Clock::now();
        chunk_errors_[i] = tools::CountPayloadErrors(keys[i], num_layers_, payload);
        verify_time += Clock::now() - v0;
        return Status::Ok();
      },
      SIZE_MAX, prefetching ? &ticket : nullptr, request_id);
  const auto l1 = Clock::now();
  if (!load.ok()) {
    std::fprintf(stderr, "\nkvtier-replay: load: %s\n", load.status().ToString().c_str());
    return false;
  }
  if (!load->fail_open.ok()) ++t.fail_open;
  t.load_us.push_back(Us(l1 - l0 - verify_time));
  t.lookup_us.push_back(static_cast<double>(load->lookup_time.count()));
  // Only the verified leading run counts: the engine would use nothing past
  // a wrong chunk. Chunks from NVMe, promoted by the load or by its prefetch
  // ticket (kvtierd counts both as NVMe hits; a load has one or the other),
  // are the trailing ones of the load.
  uint32_t verified = 0;
  while (verified < load->num_chunks && chunk_errors_[verified] == 0) ++verified;
  for (uint32_t i = 0; i < load->num_chunks; ++i) {
    if (chunk_errors_[i] != 0) ++t.verify_errors;
  }
  const uint32_t dram_chunks = load->num_chunks - load->nvme_chunks - load->prefetched_chunks;
  const uint32_t nvme_verified = verified > dram_chunks ? verified - dram_chunks : 0;
  t.hit_tokens += uint64_t{verified} * chunk_tokens;
  // Remote chunks (the last ones) are counted in nvme_chunks or prefetched_chunks too.
  const uint32_t not_remote = load->num_chunks - load->remote_chunks;
  const uint32_t remote_verified =
      std::min(nvme_verified, verified > not_remote ? verified - not_remote : 0);
  t.nvme_hit_tokens += uint64_t{nvme_verified - remote_verified} * chunk_tokens;
  t.nvme_bytes_loaded += uint64_t{nvme_verified - remote_verified} * pb;
  t.remote_hit_tokens += uint64_t{remote_verified} * chunk_tokens;
  t.remote_bytes_loaded += uint64_t{remote_verified} * pb;
  t.prefetch_ready_chunks += std::min(verified, load->prefetched_chunks);
  t.chunks_loaded += verified;
  t.bytes_loaded += uint64_t{verified} * pb;

  if (verified < keys.size()) {
    const auto s0 = Clock::now();
    auto store = client_->Store(
        ns_, tokens,
        [&](size_t i, std::span<std::byte> payload) {
          tools::FillPayload(keys[i], num_layers_, payload);
          return Status::Ok();
        },
        verified);
    t.store_us.push_back(Us(Clock::now() - s0));
    if (!store.ok()) {
      std::fprintf(stderr, "\nkvtier-replay: store: %s\n", store.status().ToString().c_str());
      return false;
    }
    if (!store->fail_open.ok()) ++t.fail_open;
    t.chunks_stored += store->stored_chunks;
    t.chunks_dropped += store->dropped_chunks;
    t.bytes_stored += store->stored_bytes;
  }
  ++t.requests;
  t.prompt_tokens += req.input_length;
  return true;
}

int ReplayClosedLoop(const ReplayOptions& options, std::span<const tools::TraceRequest> trace,
                     Progress& progress, Totals& t) {
  int exit_code = 0;
  auto runner = RequestRunner::Create(options, &exit_code);
  if (!runner) return exit_code;
  // Request ids unique to this run: several replays may share a daemon. One
  // id a request: the daemon counts its Prefetch and Load once.
  const std::string run_id = NewRunId();
  for (const auto& req : trace) {
    if (!runner->Run(req, run_id + std::to_string(t.requests), t)) return 1;
    progress.Update(t.requests, t.HitRate());
  }
  progress.Finish();
  return 0;
}

}  // namespace kvtier::replay
