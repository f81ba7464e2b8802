// kvtier-bench peers: put and get of 256 KiB, 1 MiB and 4 MiB values, side by side in
// one run, through the kvtier SDK (Store + Load of one request's chunks, bytes verified)
// and through peers the benchmark starts on loopback and stops after it: Redis
// (redis-server, no persistence; pipelined SET/GET through hiredis, bytes verified) and
// Mooncake Store (mooncake_peer.py in the `peers` venv: its master on loopback, a client
// mounting its segment over TCP, zero-copy batch put/get from registered buffers, bytes
// verified). Prints GB/s each way and kvtier's ratio to each peer. LMCache is named as not
// run (its package needs torch with CUDA).
#pragma once

#include <string>

namespace kvtier::bench {

struct PeersOptions {
  std::string socket;                         // kvtierd's socket
  std::string redis_server = "redis-server";  // the binary (PATH is searched)
  // A python with mooncake-transfer-engine-non-cuda; empty: the `peers` venv of
  // tools/install-python-envs.sh. Mooncake is not run (and says why) when it is missing.
  std::string mooncake_python;
  int iterations = 9;   // measured rounds per value size
  int num_chunks = 64;  // values per round (one request's chunks)
};

// Exit status: 0, or 1 (through Die, naming why) when Redis or Mooncake (its python being
// there) cannot be started, a round does not fit the DRAM arena, a call fails or bytes differ.
int RunPeers(const PeersOptions& options);

}  // namespace kvtier::bench
