// WritePipelined: the loop of an NVMe writer (the daemon's write-through, kvtier-bench nvme)
// with the next batch prepared while this one is written.
//
// A batch is prepared on the CPU (slot images copied out of the DRAM arena into a staging
// buffer and checksummed) and then written (NvmeTier::Write: data, fdatasync, index), which
// mostly waits on the device. Done one after the other, the preparing took about a third of
// the write time at 1-4 MiB chunks (kvtier-bench nvme, docs/BENCHMARKS.md). Here batch k is
// written on the calling thread while a helper thread prepares batch k+1 into the other of two
// staging buffers; batch k+1's write starts only once batch k's has returned, so batches
// reach the tier in order (a chunk's parent, written in an earlier batch, is indexed before
// the chunk). The peak is two batches' staging buffers instead of one.
//
// The writes stay on the calling thread and the copies go to a helper. With the roles the
// other way round (a fresh thread per batch doing NvmeTier::Write, whose RocksDB memtable
// and io_uring work allocate in the writing thread), kvtierd's peak anonymous memory in
// load_test was 52-66 MB against 16-32 MB writing one batch at a time, past its RSS
// budget; this way, 32-40 MB (the second staging buffer is 4 MiB of it there).
//
//   prepare(StagingBuffer&) -> std::optional<Batch>  the next batch, prepared into the
//                                                   buffer given, or nullopt: no more
//   write(Batch&)                                   writes it; must not throw
//
// At most `max_batches` batches (at least one is tried); returns how many were prepared,
// all of them written when it returns. write runs on the calling thread, prepare on a
// helper thread (the first batch's: on the calling thread), never two prepares at once.
// If prepare throws, the write beside it ends first and then the exception passes on. When
// no helper thread can be started, that batch's prepare runs after its write instead. A
// helper thread costs some tens of microseconds a batch; a write's fdatasync, milliseconds.
//
// Thread-safety: the two buffers must be the caller's alone for the whole call.
#pragma once

#include <cstddef>
#include <exception>
#include <optional>
#include <thread>
#include <utility>

#include "kvtier/tiers/staging_buffer.h"

namespace kvtier {

template <typename Batch, typename Prepare, typename Write>
size_t WritePipelined(StagingBuffer (&staging)[2], size_t max_batches, Prepare&& prepare,
                      Write&& write) {
  std::optional<Batch> current = prepare(staging[0]);
  size_t batches = 0;
  size_t next_buffer = 1;
  while (current.has_value()) {
    ++batches;
    if (batches >= max_batches) {
      write(*current);
      break;
    }
    std::optional<Batch> next;
    std::exception_ptr failed;
    const auto prepare_next = [&] {  // touches only `next`, `failed` and the other buffer
      try {
        next = prepare(staging[next_buffer]);
      } catch (...) {
        failed = std::current_exception();
      }
    };
    std::thread copier;
    try {
      copier = std::thread(prepare_next);
    } catch (...) {
      // No thread to be had (std::system_error at a thread or memory limit, std::bad_alloc
      // for its state): this batch is written and the next prepared after it, on this thread,
      // rather than the batch left unwritten.
    }
    write(*current);
    if (copier.joinable()) {
      copier.join();
    } else {
      prepare_next();
    }
    if (failed) std::rethrow_exception(failed);
    current = std::move(next);
    next_buffer ^= 1;
  }
  return batches;
}

}  // namespace kvtier
