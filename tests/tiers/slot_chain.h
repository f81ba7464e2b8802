// Test helpers for tiers' tests: 4 KiB-aligned buffers and chains of sealed
// slot images (one prompt's chunks, each with a deterministic payload).
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "kvtier/chunk_key.h"
#include "kvtier/namespace_spec.h"
#include "kvtier/slot_image.h"
#include "kvtier/tiers/nvme_tier.h"

namespace kvtier {

struct AlignedBuf {
  explicit AlignedBuf(size_t n) : p(static_cast<std::byte*>(std::aligned_alloc(4096, n))), n(n) {
    std::memset(p, 0, n);
  }
  ~AlignedBuf() { std::free(p); }
  std::span<std::byte> span() const { return {p, n}; }
  std::byte* p;
  size_t n;
};

// A chain of sealed slot images for the prompt `stream`.
struct Chain {
  Chain(const NamespaceSpec& spec, uint32_t stream, size_t num_chunks)
      : ns(spec.Digest()), layout(SlotLayout::For(spec)) {
    for (size_t i = 0; i < num_chunks * spec.chunk_tokens; ++i) {
      tokens.push_back(static_cast<int32_t>(stream * 100003 + i));
    }
    keys = ComputeChunkKeys(ns, tokens, spec.chunk_tokens);
    for (size_t i = 0; i < num_chunks; ++i) {
      images.push_back(std::make_unique<AlignedBuf>(layout.slot_bytes));
      std::byte* slot = images.back()->p;
      for (uint64_t b = 0; b < layout.payload_bytes; ++b) {
        slot[layout.header_bytes + b] = std::byte(static_cast<uint8_t>(stream + i * 7 + b * 13));
      }
      SealSlot(slot, layout, Id(i), 100 + i);
    }
  }
  SlotIdentity Id(size_t i) const {
    return {ns, keys[i], i == 0 ? ns : keys[i - 1],
            std::span<const int32_t>(tokens).subspan(i * layout.chunk_tokens, layout.chunk_tokens)};
  }
  std::vector<NvmeImage> Images() const {
    std::vector<NvmeImage> out;
    for (size_t i = 0; i < images.size(); ++i) {
      out.push_back({keys[i], i == 0 ? ns : keys[i - 1], ns, images[i]->span()});
    }
    return out;
  }
  NamespaceId ns;
  SlotLayout layout;
  std::vector<int32_t> tokens;
  std::vector<ChunkKey> keys;
  std::vector<std::unique_ptr<AlignedBuf>> images;
};

}  // namespace kvtier
