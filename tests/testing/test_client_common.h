// Pieces shared by the modes of kvtier_test_client (tests only, never
// installed): deterministic token streams, the conversation set of the crash
// loop, connecting, and checking loaded bytes.
//
// Thread-safety: the functions are pure or act on their arguments only;
// PayloadCheck is used from one thread.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/tools/synthetic_kv.h"

namespace kvtier::testclient {

inline uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// `count` deterministic token ids of stream `stream` from position `from`.
inline void AppendTokens(std::vector<int32_t>* out, uint64_t stream, uint64_t from,
                         uint64_t count) {
  for (uint64_t i = from; i < from + count; ++i) {
    out->push_back(static_cast<int32_t>(Mix(Mix(stream) ^ i) % 128000));
  }
}

struct Common {
  std::string socket;
  std::string model = "tiny";
  uint32_t chunk_tokens = 128;
  int64_t deadline_ms = 2000;
};

inline Result<std::unique_ptr<Client>> ConnectOrFail(const Common& c, const char* name) {
  ClientOptions o;
  o.socket_path = c.socket;
  o.deadline = std::chrono::milliseconds(c.deadline_ms);
  o.connect_timeout = std::chrono::milliseconds(std::max<int64_t>(c.deadline_ms, 2000));
  o.client_name = name;
  auto client = Client::Connect(o);
  if (!client.ok()) return client.status();
  if (!(*client)->connected()) return Status::Unavailable("kvtierd is not reachable");
  return client;
}

// Set by SIGTERM once InstallStopHandler ran: long-running modes finish the
// call under way, print their RESULT line and exit.
inline std::atomic<bool> g_stop{false};

inline void InstallStopHandler() {
  struct sigaction sa = {};
  sa.sa_handler = [](int) { g_stop.store(true); };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

// The conversations of the crash loop and the load test: conversation c is
// kSharedChunks chunks every conversation shares (a system prompt), then its
// own stream; turn t (1..kTurns) of it is its first kSharedChunks +
// kChunksPerTurn * t chunks and a partial tail (the start of the next chunk).
struct Conversations {
  static constexpr uint32_t kSharedChunks = 2;
  static constexpr uint32_t kChunksPerTurn = 2;
  static constexpr uint32_t kTurns = 8;
  static constexpr uint32_t kMaxChunks = kSharedChunks + kChunksPerTurn * kTurns;

  // Turn `turn` of conversation `c`; with `turn` = kTurns and no tail, every
  // chunk the conversation can have.
  static std::vector<int32_t> Prompt(uint64_t c, uint32_t turn, uint32_t chunk_tokens,
                                     bool with_tail = true) {
    std::vector<int32_t> tokens;
    AppendTokens(&tokens, /*stream=*/7, 0, uint64_t{kSharedChunks} * chunk_tokens);
    const uint64_t own = uint64_t{kChunksPerTurn} * turn * chunk_tokens +
                         (with_tail ? Mix(c * 64 + turn) % chunk_tokens : 0);
    AppendTokens(&tokens, Mix(0xC0 + c), tokens.size(), own);
    return tokens;
  }
};

// Checks loaded payloads against the deterministic pattern of their keys and
// counts what differs; each bad chunk is reported on stderr.
struct PayloadCheck {
  uint32_t num_layers = 0;
  uint64_t payload_bytes = 0;
  uint64_t checked_chunks = 0;
  uint64_t bad_chunks = 0;  // chunks with at least one wrong byte
  uint64_t wrong_bytes = 0;

  // Checks the first `n` chunks of `buffer` ([n][payload_bytes]) against
  // `keys`. Returns how many leading chunks are right.
  size_t Check(const std::vector<ChunkKey>& keys, std::span<const std::byte> buffer, size_t n) {
    size_t good_prefix = n;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t e = tools::CountPayloadErrors(
          keys[i], num_layers, buffer.subspan(i * payload_bytes, payload_bytes));
      ++checked_chunks;
      if (e == 0) continue;
      good_prefix = std::min(good_prefix, i);
      ++bad_chunks;
      wrong_bytes += e;
      std::fprintf(stderr, "kvtier_test_client[%d]: chunk %zu (%s): %llu bytes differ\n",
                   static_cast<int>(getpid()), i, keys[i].ToHex().c_str(),
                   static_cast<unsigned long long>(e));
    }
    return good_prefix;
  }
};

// Writes the deterministic payload of each chunk (a ChunkWriter for Store).
inline ChunkWriter PatternWriter(const std::vector<ChunkKey>& keys, uint32_t num_layers) {
  return [&keys, num_layers](size_t i, std::span<std::byte> payload) {
    tools::FillPayload(keys[i], num_layers, payload);
    return Status::Ok();
  };
}

}  // namespace kvtier::testclient
