// kvtier-bench remote: the remote tier (RemoteTier over RedisCluster) against plain
// pipelined hiredis on the same store, in the same run. Per image size (payloads of
// 256 KiB, 1 MiB and 4 MiB, sealed slot images with their payload checksum), each round:
// RemoteTier::WriteMany of the round's images, then ReadMany into buffers of their own
// (every image verified); and hiredis SET then GET of the same bytes under the same keys,
// one pipeline per node, the nodes one after another (as RedisCluster does), each GET
// reply copied into a buffer. FLUSHALL on every master before each of the two, untimed.
// Prints GB/s (medians of the rounds) each way and the tier's ratio to hiredis.
//
// The store: the one at `url`, or (url empty) one the benchmark starts on loopback and
// stops: a Redis Cluster of 3 masters, or one server with `single`.
#pragma once

#include <string>

namespace kvtier::bench {

struct RemoteOptions {
  // "redis://host:port[,...]" of a store to use (its keys are flushed: FLUSHALL on every
  // master). Empty: start one here. Default: empty.
  std::string url;
  std::string redis_server = "redis-server";  // the binary (PATH is searched)
  bool single = false;  // start one plain server instead of a 3-master cluster
  int iterations = 9;   // measured rounds per size (one more, first, is a warm-up)
  // Images per round; 0: 64, 32 and 16 for 256 KiB, 1 MiB and 4 MiB (16-64 MiB a round).
  int num_chunks = 0;
  // The tier with a MAC key (a random one for the run), as kvtierd --remote-key-file.
  bool mac = false;
};

// Exit status: 0, or 1 (through Die, naming why) when the store cannot be started or
// reached, or an image is not stored, not read back or differs.
int RunRemote(const RemoteOptions& options);

}  // namespace kvtier::bench
