// KvEventSubscriber: reads kvtierd's KV events (kvtier/kv_event.h): a ZMQ SUB
// socket on the events endpoint and, optionally, a DEALER on the replay
// endpoint. For kvtierctl events, kvtier-replay and the tests.
//
// Thread-safety: not thread-safe (ZMQ sockets belong to one thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/kv_event.h"
#include "kvtier/status.h"

namespace kvtier::tools {

class KvEventSubscriber {
 public:
  struct Message {
    uint64_t seq = 0;
    KvEventBatch batch;
  };
  // Connects (ZMQ connects lazily: batches sent before the connection is up
  // are not received; the replay socket has them). `replay_address` "" for
  // none. Errors: INVALID_ARGUMENT for an endpoint ZMQ refuses.
  static Result<std::unique_ptr<KvEventSubscriber>> Connect(const std::string& address,
                                                            const std::string& replay_address);
  ~KvEventSubscriber();

  // The next batch published, waiting up to `timeout`; nullopt when none came.
  // Errors: INVALID_ARGUMENT for a message that is not [topic, 8-byte
  // sequence, batch] or whose batch does not decode.
  Result<std::optional<Message>> Next(std::chrono::milliseconds timeout);
  // The buffered batches from sequence `start` on, in order, up to the end
  // marker. Errors: FAILED_PRECONDITION without a replay address;
  // DEADLINE_EXCEEDED when the end marker does not come within `timeout`;
  // those of Next for a malformed message.
  Result<std::vector<Message>> Replay(uint64_t start, std::chrono::milliseconds timeout);

 private:
  struct Sockets;
  explicit KvEventSubscriber(std::unique_ptr<Sockets> sockets);
  std::unique_ptr<Sockets> sockets_;
};

// The endpoint a client connects to for an endpoint kvtierd binds: a tcp
// wildcard host (* or 0.0.0.0) becomes 127.0.0.1, [::] becomes [::1].
std::string ConnectableAddress(const std::string& bound);

}  // namespace kvtier::tools
