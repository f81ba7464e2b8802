// kvtier-bench nvme: the NVMe tier's chunk I/O (NvmeTier alone, not through kvtierd) vs fio
// with io_uring and O_DIRECT on the same file, the same block size and queue depth 32, and
// the same access pattern:
//   writes  the tier in its steady state: a fill pass of every slot (untimed), then as many
//           chunks again, each evicting the least recently written, so slots are reused in
//           ascending order; in the writer's batches (up to 256 chunks and 64 MiB, as with
//           kvtierd's default arena) and timed as it pays them: the copy out of the arena
//           into its staging buffer, the payload checksum, and NvmeTier::Write (data,
//           fdatasync, RocksDB). fio: sequential writes, fdatasync after each batch's worth,
//           buffers not registered (the writer's copies are not). fio randwrite beside it.
//   reads   random stored chunks, batches of up to 256 MiB, each verified (header and
//           XXH3 checksum). fio: randread, buffers registered as the tier's are.
#pragma once

#include <cstdint>
#include <string>

namespace kvtier::bench {

// `file_bytes`: the test file's size (a multiple of 4096); `seconds`: fio's runtime per
// measurement and the least time the tier reads for; `plain_buffers`: register no buffers
// with io_uring on either side. Exit status 0, or 1 (Die) when an I/O or a check fails.
int RunNvme(const std::string& dir, uint64_t file_bytes, int seconds, bool plain_buffers);

}  // namespace kvtier::bench
