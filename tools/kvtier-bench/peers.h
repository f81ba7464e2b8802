// kvtier-bench peers: put and get of 256 KiB, 1 MiB and 4 MiB values, side by side in
// one run, through the kvtier SDK (Store + Load of one request's chunks, bytes verified)
// and through peers the benchmark starts on loopback and stops after it: Redis
// (redis-server, no persistence; pipelined SET/GET through hiredis, bytes verified).
// Prints GB/s each way and kvtier's ratio to each peer. Mooncake Store and LMCache are
// named as not run: their PyPI packages are not among the project's venvs yet.
#pragma once

#include <string>

namespace kvtier::bench {

struct PeersOptions {
  std::string socket;                      // kvtierd's socket
  std::string redis_server = "redis-server";  // the binary (PATH is searched)
  int iterations = 9;                      // measured rounds per value size
  int num_chunks = 64;                     // values per round (one request's chunks)
};

// Exit status: 0, or 1 (through Die, naming why) when Redis cannot be started, a round
// does not fit the DRAM arena, a call fails or bytes differ.
int RunPeers(const PeersOptions& options);

}  // namespace kvtier::bench
