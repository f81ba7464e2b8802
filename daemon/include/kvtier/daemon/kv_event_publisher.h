// KvEventPublisher: publishes KV events (kvtier/kv_event.h: vLLM's schema and
// framing) on a ZMQ PUB socket, with a replay buffer served on a ROUTER
// socket, as vLLM's ZmqEventPublisher does.
//
// The core hands each event to Add, which only appends it to a bounded queue
// (never a ZMQ call, never a wait). The publisher's own thread takes what is
// queued every flush_interval, sends it as batches of at most batch_events
// events, each batch with the next sequence number (from 0), and keeps the
// last replay_batches batches for replay.
//
// Drops: when the queue holds queue_events events, Add drops the event and
// counts it (dropped()). The next batch sent after a drop skips one sequence
// number, a batch that never existed: a subscriber sees the gap, asks the
// replay socket for it, gets the batches after it only, and so knows that
// events were lost and that its view must be rebuilt (kvtierctl ls). A PUB
// socket past its high-water mark (a slow subscriber) drops whole batches
// too; those are in the replay buffer.
//
// Thread-safety: Add and the counters are thread-safe; Add takes a mutex of
// its own that nothing else is taken under (a leaf in every lock order).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/kv_event.h"
#include "kvtier/status.h"

namespace kvtier {

// Where the core's KV events go. Implementations are thread-safe and never block.
class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void Add(KvEvent event) = 0;
};

struct KvEventPublisherOptions {
  // The PUB socket's endpoint, bound: tcp://HOST:PORT (HOST an address or *,
  // PORT 0 for any free one) or ipc://PATH. Required.
  std::string address;
  // The replay ROUTER socket's endpoint, bound; "" for none. Default: "".
  std::string replay_address;
  // The first frame of every message (subscribers filter on it). Default: "".
  std::string topic;
  // Batches kept for replay (vLLM's buffer_steps). Default: 10,000.
  size_t replay_batches = 10000;
  // Events queued at most between two flushes (vLLM's max_queue_size);
  // past it events are dropped. Default: 100,000.
  size_t queue_events = 100000;
  // Most events in one batch. Default: 1,024.
  size_t batch_events = 1024;
  // How often the thread sends what is queued (and serves replay requests).
  // Default: 5 ms.
  std::chrono::milliseconds flush_interval{5};
  // The PUB socket's send high-water mark, in messages (vLLM's hwm). Default: 100,000.
  int hwm = 100000;
};

class KvEventPublisher : public KvEventSink {
 public:
  // Binds the sockets and starts the thread. Errors: INVALID_ARGUMENT when an
  // endpoint cannot be bound (a malformed address, a port in use, an ipc path
  // in a missing directory), with ZMQ's reason; options.address empty.
  static Result<std::unique_ptr<KvEventPublisher>> Create(const KvEventPublisherOptions& options);
  // Sends what is queued, then closes the sockets.
  ~KvEventPublisher() override;

  void Add(KvEvent event) override;

  // The endpoints bound (tcp port 0 resolved to the port taken).
  const std::string& address() const { return bound_address_; }
  const std::string& replay_address() const { return bound_replay_address_; }
  // Events sent, and events dropped because the queue was full (both only grow).
  uint64_t published() const { return published_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  struct Sockets;
  KvEventPublisher(const KvEventPublisherOptions& options, std::unique_ptr<Sockets> sockets);
  void Loop();
  // Sends what is queued. Runs on the thread only.
  void Flush();
  // Answers one replay request if one is waiting. Runs on the thread only.
  void ServeReplay();

  const KvEventPublisherOptions options_;
  std::unique_ptr<Sockets> sockets_;  // used by the thread only, once started
  std::string bound_address_, bound_replay_address_;
  std::mutex mu_;
  std::condition_variable stop_cv_;
  std::vector<KvEvent> queue_;        // GUARDED_BY(mu_)
  bool dropped_since_flush_ = false;  // GUARDED_BY(mu_)
  bool stop_ = false;                 // GUARDED_BY(mu_)
  uint64_t next_seq_ = 0;             // the thread's
  std::atomic<uint64_t> published_{0}, dropped_{0};
  std::thread thread_;
};

// OK when `address` is tcp://HOST:PORT (HOST not empty, PORT 0..65535) or
// ipc://PATH (PATH not empty); else INVALID_ARGUMENT saying which forms are
// taken. Binding may still fail (a port in use, a missing directory).
Status CheckKvEventsAddress(const std::string& address);

// Prometheus text of the publisher's counters, kvtier_events_published_total
// and kvtier_events_dropped_total (both 0 when `publisher` is nullptr: events off).
std::string KvEventMetricsText(const KvEventPublisher* publisher);

}  // namespace kvtier
