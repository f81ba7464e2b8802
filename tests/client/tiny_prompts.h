// Prompts and payloads of the "tiny" model preset (16-token chunks, 8 KiB
// each) for the client tests: deterministic token streams, and payloads in
// each chunk's FillPayload pattern, so that a load can be checked byte by byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "kvtier/tools/model_presets.h"
#include "kvtier/tools/synthetic_kv.h"

namespace kvtier::testing {

inline constexpr uint32_t kChunkTokens = 16;

inline NamespaceSpec TinySpec(const std::string& salt = "") {
  auto spec = tools::ModelPreset("tiny", kChunkTokens);  // 512 B/token: 8 KiB per chunk
  EXPECT_TRUE(spec.ok());
  spec->cache_salt = salt;
  return *spec;
}

// `n` deterministic tokens of stream `stream`.
inline std::vector<int32_t> Tokens(uint32_t stream, size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) {
    t[i] = static_cast<int32_t>((stream * 2654435761u + i * 40503u) % 128000);
  }
  return t;
}

// [num_full_chunks][payload_bytes] with each chunk's FillPayload pattern.
inline std::vector<std::byte> Payloads(const NamespaceHandle& ns, std::span<const int32_t> tokens) {
  const auto keys = Client::ChunkKeys(ns, tokens);
  const uint64_t pb = ns.layout.payload_bytes;
  std::vector<std::byte> out(keys.size() * pb);
  for (size_t i = 0; i < keys.size(); ++i) {
    tools::FillPayload(keys[i], ns.spec.num_layers, std::span<std::byte>(out.data() + i * pb, pb));
  }
  return out;
}

}  // namespace kvtier::testing
