// Fuzz targets: every RPC request through CacheCore (kvtier/daemon/cache_core.h): sessions,
// OpenNamespace, Lookup, Prefetch, PrefetchStatus, ReleaseRead, ReserveWrite, CommitWrite,
// AbortWrite and Admin.Evict, interleaved with TTL expiry, a restart and a client scribbling
// over the arena. fuzz_cache_core runs a DRAM-only core; fuzz_cache_core_nvme (this file
// built with KVTIER_FUZZ_NVME) adds an NVMe tier in memory under each write policy, with the
// NVMe writer, restarts over the same NVMe bytes and NVMe faults. It is the slower one:
// opening its RocksDB index, even in memory, costs more than the rest of an input.
//
// Input: a configuration (DRAM of 2..24 slots, TTLs, limits, write policy and NVMe size),
// then up to 64 calls, each decoded by CoreFuzzDriver (core_fuzz_driver.h says how, and
// what it checks). The two targets read inputs alike, so their corpora mix.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>

#include "core_fuzz_driver.h"

#ifdef KVTIER_FUZZ_NVME
constexpr bool kNvme = true;
#else
constexpr bool kNvme = false;
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  kvtier::fuzz::CoreFuzzDriver driver(in, kNvme);
  for (int i = 0; i < 64 && driver.Step(); ++i) {
  }
  driver.Finish();
  return 0;
}
