#include "kvtier/daemon/kv_event_publisher.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <iterator>
#include <optional>
#include <utility>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "kvtier/logging.h"
#include "kvtier/socket_path.h"

namespace kvtier {

struct KvEventPublisher::Sockets {
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;                  // ROUTER, when a replay address is given
  std::deque<std::pair<uint64_t, std::string>> buffer;  // (sequence, payload), oldest first
  LogLimiter replay_log;  // malformed replay requests, one warning per 10 s
};

namespace {

// Binds `socket` to `address`; returns the endpoint bound (ZMQ_LAST_ENDPOINT).
Result<std::string> Bind(zmq::socket_t& socket, const std::string& address) {
  // ZMQ replaces an ipc:// socket file unasked, even one a live process listens
  // on (another kvtierd's events stream would go dead without a word).
  if (address.rfind("ipc://", 0) == 0 && UnixSocketListening(address.substr(6))) {
    return Status::FailedPrecondition("cannot bind " + address +
                                      ": in use (another program listens on it)");
  }
  try {
    // tcp://[::1]:PORT needs it; an IPv4 address bound with it shows as ::ffff:a.b.c.d.
    if (address.rfind("tcp://[", 0) == 0) socket.set(zmq::sockopt::ipv6, 1);
    socket.bind(address);
    return socket.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return Status::InvalidArgument("cannot bind " + address + ": " + e.what());
  }
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(
    const KvEventPublisherOptions& options) {
  if (options.address.empty()) return Status::InvalidArgument("the events address is empty");
  auto sockets = std::make_unique<Sockets>();
  std::string bound, replay_bound;
  try {
    sockets->pub.set(zmq::sockopt::sndhwm, options.hwm);
    sockets->pub.set(zmq::sockopt::linger, 200);  // the last batches at shutdown
    auto b = Bind(sockets->pub, options.address);
    if (!b.ok()) return b.status();
    bound = *b;
    if (!options.replay_address.empty()) {
      sockets->replay.emplace(sockets->context, zmq::socket_type::router);
      // A whole replay and its end marker fit (vLLM's 2 * (buffer_steps + 1)).
      sockets->replay->set(zmq::sockopt::sndhwm,
                           static_cast<int>(2 * (options.replay_batches + 1)));
      sockets->replay->set(zmq::sockopt::linger, 0);
      auto r = Bind(*sockets->replay, options.replay_address);
      if (!r.ok()) return r.status();
      replay_bound = *r;
    }
  } catch (const zmq::error_t& e) {
    return Status::InvalidArgument(std::string("ZMQ: ") + e.what());
  }
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(options, std::move(sockets)));
  p->bound_address_ = std::move(bound);
  p->bound_replay_address_ = std::move(replay_bound);
  p->thread_ = std::thread([raw = p.get()] { raw->Loop(); });
  return p;
}

KvEventPublisher::KvEventPublisher(const KvEventPublisherOptions& options,
                                   std::unique_ptr<Sockets> sockets)
    : options_(options), sockets_(std::move(sockets)) {}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void KvEventPublisher::Add(KvEvent event) {
  std::lock_guard lock(mu_);
  if (queue_.size() >= options_.queue_events) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    dropped_since_flush_ = true;
    return;
  }
  queue_.push_back(std::move(event));
}

void KvEventPublisher::Loop() {
  for (;;) {
    bool stopping;
    if (sockets_->replay) {
      zmq::pollitem_t item{sockets_->replay->handle(), 0, ZMQ_POLLIN, 0};
      try {
        zmq::poll(&item, 1, options_.flush_interval);
      } catch (const zmq::error_t& e) {
        spdlog::warn("KV events: polling the replay socket failed: {}", e.what());
      }
      if (item.revents & ZMQ_POLLIN) ServeReplay();
      std::lock_guard lock(mu_);
      stopping = stop_;
    } else {
      std::unique_lock lock(mu_);
      stopping = stop_cv_.wait_for(lock, options_.flush_interval, [this] { return stop_; });
    }
    Flush();
    if (stopping) return;
  }
}

void KvEventPublisher::Flush() {
  std::vector<KvEvent> events;
  bool gap;
  {
    std::lock_guard lock(mu_);
    events.swap(queue_);
    gap = dropped_since_flush_;
    dropped_since_flush_ = false;
  }
  if (gap) ++next_seq_;  // a sequence number no batch has: the subscriber sees the loss
  const std::string topic = options_.topic;
  for (size_t from = 0; from < events.size(); from += options_.batch_events) {
    KvEventBatch batch;
    batch.ts = UnixSeconds();
    batch.data_parallel_rank = 0;
    const size_t to = std::min(events.size(), from + options_.batch_events);
    batch.events.assign(std::make_move_iterator(events.begin() + from),
                        std::make_move_iterator(events.begin() + to));
    std::string payload = EncodeKvEventBatch(batch);
    const uint64_t seq = next_seq_++;
    const std::string seq_bytes = KvEventSequenceBytes(seq);
    try {
      // PUB never blocks: past its high-water mark it drops (the batch stays in the buffer).
      auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
      sockets_->pub.send(zmq::buffer(topic), more);
      sockets_->pub.send(zmq::buffer(seq_bytes), more);
      sockets_->pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      spdlog::warn("KV events: sending batch {} failed: {}", seq, e.what());
    }
    published_.fetch_add(to - from, std::memory_order_relaxed);
    if (sockets_->buffer.size() >= options_.replay_batches) sockets_->buffer.pop_front();
    if (options_.replay_batches > 0) sockets_->buffer.emplace_back(seq, std::move(payload));
  }
}

void KvEventPublisher::ServeReplay() {
  std::vector<zmq::message_t> frames;
  try {
    if (!zmq::recv_multipart(*sockets_->replay, std::back_inserter(frames),
                             zmq::recv_flags::dontwait)) {
      return;
    }
  } catch (const zmq::error_t& e) {
    spdlog::warn("KV events: reading a replay request failed: {}", e.what());
    return;
  }
  // [identity, empty delimiter, start sequence], as vLLM takes it (REQ or DEALER peers).
  std::optional<uint64_t> start;
  if (frames.size() == 3) start = KvEventSequenceFrom(frames[2].to_string_view());
  if (!start) {
    if (auto held_back = sockets_->replay_log.Admit()) {
      spdlog::warn(
          "KV events: a replay request of {} frames is not [identity, '', 8-byte "
          "start sequence]; ignored{}",
          frames.size(), HeldBack(*held_back));
    }
    return;
  }
  const std::string identity = frames[0].to_string();
  const std::string topic = options_.topic;
  auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
  try {
    for (const auto& [seq, payload] : sockets_->buffer) {
      if (seq < *start) continue;
      const std::string seq_bytes = KvEventSequenceBytes(seq);
      sockets_->replay->send(zmq::buffer(identity), more);
      sockets_->replay->send(zmq::message_t(), more);
      sockets_->replay->send(zmq::buffer(topic), more);
      sockets_->replay->send(zmq::buffer(seq_bytes), more);
      sockets_->replay->send(zmq::buffer(payload), zmq::send_flags::dontwait);
    }
    const std::string end = KvEventSequenceBytes(kKvEventReplayEnd);
    sockets_->replay->send(zmq::buffer(identity), more);
    sockets_->replay->send(zmq::message_t(), more);
    sockets_->replay->send(zmq::message_t(), more);
    sockets_->replay->send(zmq::buffer(end), more);
    sockets_->replay->send(zmq::message_t(), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    spdlog::warn("KV events: answering a replay request failed: {}", e.what());
  }
}

}  // namespace kvtier

namespace kvtier {

Status CheckKvEventsAddress(const std::string& address) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("'" + address + "' " + why +
                                   " (give tcp://HOST:PORT, HOST an IPv4 address, [IPv6 address], "
                                   "* or an interface name, or ipc://PATH)");
  };
  if (address.rfind("ipc://", 0) == 0) {
    return address.size() > 6 ? Status::Ok() : bad("names no path");
  }
  if (address.rfind("tcp://", 0) != 0) return bad("is not a tcp:// or ipc:// endpoint");
  const size_t colon = address.rfind(':');
  if (colon <= 6) return bad("has no :PORT");
  const std::string port = address.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535) {
    return bad("has a port that is not 0..65535");
  }
  // ZMQ binds to an address or an interface, never to a name it would have to look up.
  const std::string host = address.substr(6, colon - 6);
  if (host == "*") return Status::Ok();
  in_addr v4{};
  in6_addr v6{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return Status::Ok();
  if (host.size() > 2 && host.front() == '[' && host.back() == ']' &&
      inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &v6) == 1) {
    return Status::Ok();
  }
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return bad("has an IPv6 HOST without [ ]");
  if (!host.empty() && host.front() == '[') {
    return host.back() == ']' ? bad("has '" + host + "', which is not an IPv6 address")
                              : bad("has no ']' after its IPv6 address");
  }
  if (!host.empty() && if_nametoindex(host.c_str()) != 0) return Status::Ok();  // "eth0"
  return bad("has HOST '" + host +
             "', which is not an address, * or a network interface of this machine (a host "
             "name is not looked up: give its address)");
}

std::string KvEventMetricsText(const KvEventPublisher* publisher) {
  const uint64_t published = publisher ? publisher->published() : 0;
  const uint64_t dropped = publisher ? publisher->dropped() : 0;
  return "# HELP kvtier_events_published_total KV events sent on the events socket "
         "(--events-address).\n"
         "# TYPE kvtier_events_published_total counter\n"
         "kvtier_events_published_total " +
         std::to_string(published) +
         "\n"
         "# HELP kvtier_events_dropped_total KV events dropped because the publisher's queue was "
         "full (each drop leaves a gap in the batch sequence numbers).\n"
         "# TYPE kvtier_events_dropped_total counter\n"
         "kvtier_events_dropped_total " +
         std::to_string(dropped) + "\n";
}

}  // namespace kvtier
