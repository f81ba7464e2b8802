// Helpers shared by kvtier-bench's subcommands (main.cc, peers.cc).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/admin_client.h"
#include "kvtier/client.h"

namespace kvtier::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
inline double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

[[noreturn]] inline void Die(const std::string& what) {
  std::fprintf(stderr, "kvtier-bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Must(Result<T> r, const char* what) {
  if (!r.ok()) Die(std::string(what) + ": " + r.status().ToString());
  return std::move(r).value();
}

// A client of kvtierd at `socket` with a 10 s deadline (a benchmark measures; it must
// not fail open); exits when kvtierd is not reachable.
// `control_ring`: ClientOptions::control_ring (Lookups over gRPC when false).
std::unique_ptr<Client> ConnectOrDie(const std::string& socket, bool control_ring = true);
std::unique_ptr<AdminClient> AdminStub(const std::string& socket);

// Prompt tokens unique to `seed`.
std::vector<int32_t> UniquePrompt(uint64_t seed, size_t num_tokens);

// A namespace whose chunk payload is exactly `payload_bytes` (256 B per token).
NamespaceSpec BenchSpec(uint64_t payload_bytes, const std::string& model);

// The lookup benchmarks' namespace (lookup, scale): tiny, 512 B per token,
// 256-token chunks.
NamespaceSpec LookupSpec(const std::string& model);
// Stores `tokens` in `ns` with zero payloads; exits unless every chunk is in DRAM.
// Returns the number of chunks.
uint64_t StoreZerosOrDie(Client& client, const NamespaceHandle& ns,
                         std::span<const int32_t> tokens);

// One engine request's Store of `src` then Load into `dst` (the prompt's chunks, each
// `src.size() / chunks` bytes), checked: every chunk stored and loaded, dst == src.
// Exits on any shortfall. Returns the seconds of each call.
struct StoreLoadSeconds {
  double store = 0;
  double load = 0;
};
StoreLoadSeconds StoreLoadVerified(Client& client, const NamespaceHandle& ns,
                                   std::span<const int32_t> tokens, std::span<const std::byte> src,
                                   std::span<std::byte> dst, uint32_t chunks);

}  // namespace kvtier::bench
