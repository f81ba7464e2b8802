// The chained chunk-key hash, one copy per instruction set (chunk_hash_impl.inc compiled
// with XXH_INLINE_ALL in chunk_hash_{baseline,avx2,avx512}.cc, each with its own -m flags).
// chunk_key.cc picks one at run time. Private to kvtier_common.
//
// These files use only C headers and raw pointers: a C++ inline function (std::vector,
// std::span, ...) compiled with -mavx512f could be the copy the linker keeps for every
// caller, and fault on a CPU without AVX-512.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvtier::chunk_hash {

// Writes num_chunks keys (lo, hi pairs) to `out`: key_0 = XXH3-128(parent || chunk 0),
// key_i = XXH3-128(key_{i-1} || chunk i). Chunk i is tokens[i*chunk_tokens, (i+1)*chunk_tokens).
using ChainFn = void (*)(uint64_t parent_lo, uint64_t parent_hi, const int32_t* tokens,
                         size_t chunk_tokens, size_t num_chunks, uint64_t* out);

void ChainBaseline(uint64_t parent_lo, uint64_t parent_hi, const int32_t* tokens,
                   size_t chunk_tokens, size_t num_chunks, uint64_t* out);
#if KVTIER_HASH_X86
void ChainAvx2(uint64_t parent_lo, uint64_t parent_hi, const int32_t* tokens, size_t chunk_tokens,
               size_t num_chunks, uint64_t* out);
void ChainAvx512(uint64_t parent_lo, uint64_t parent_hi, const int32_t* tokens, size_t chunk_tokens,
                 size_t num_chunks, uint64_t* out);
#endif

}  // namespace kvtier::chunk_hash
