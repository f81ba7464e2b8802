#include "kvtier/tools/kv_event_subscriber.h"

#include <iterator>
#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace kvtier::tools {

struct KvEventSubscriber::Sockets {
  zmq::context_t context{1};
  zmq::socket_t sub{context, zmq::socket_type::sub};
  std::optional<zmq::socket_t> replay;  // DEALER
};

namespace {

// Reads one multipart message when one comes within `timeout`.
Result<std::vector<zmq::message_t>> Receive(zmq::socket_t& socket,
                                            std::chrono::milliseconds timeout) {
  std::vector<zmq::message_t> frames;
  try {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return frames;
    if (!zmq::recv_multipart(socket, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
      frames.clear();  // nothing after all
    }
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("ZMQ: ") + e.what());
  }
  return frames;
}

// [topic, sequence, payload] as a Message.
Result<KvEventSubscriber::Message> Parse(const zmq::message_t* frames, size_t n) {
  if (n != 3) {
    return Status::InvalidArgument("an events message has " + std::to_string(n) +
                                   " frames, not 3 (topic, sequence, batch)");
  }
  auto seq = KvEventSequenceFrom(frames[1].to_string_view());
  if (!seq) return Status::InvalidArgument("an events message's sequence is not 8 bytes");
  auto batch = DecodeKvEventBatch(frames[2].to_string_view());
  if (!batch.ok()) return batch.status();
  return KvEventSubscriber::Message{*seq, std::move(batch).value()};
}

}  // namespace

Result<std::unique_ptr<KvEventSubscriber>> KvEventSubscriber::Connect(
    const std::string& address, const std::string& replay_address) {
  auto s = std::make_unique<Sockets>();
  std::string connecting = address;  // named in the error
  try {
    s->sub.set(zmq::sockopt::linger, 0);
    s->sub.set(zmq::sockopt::ipv6, 1);  // tcp://[::1]:PORT
    s->sub.set(zmq::sockopt::subscribe, "");
    s->sub.connect(ConnectableAddress(address));
    if (!replay_address.empty()) {
      s->replay.emplace(s->context, zmq::socket_type::dealer);
      s->replay->set(zmq::sockopt::linger, 0);
      s->replay->set(zmq::sockopt::ipv6, 1);
      connecting = replay_address;
      s->replay->connect(ConnectableAddress(replay_address));
    }
  } catch (const zmq::error_t& e) {
    return Status::InvalidArgument("cannot connect to " + connecting + ": " + e.what() +
                                   " (give tcp://HOST:PORT or ipc://PATH)");
  }
  return std::unique_ptr<KvEventSubscriber>(new KvEventSubscriber(std::move(s)));
}

KvEventSubscriber::KvEventSubscriber(std::unique_ptr<Sockets> sockets)
    : sockets_(std::move(sockets)) {}

KvEventSubscriber::~KvEventSubscriber() = default;

Result<std::optional<KvEventSubscriber::Message>> KvEventSubscriber::Next(
    std::chrono::milliseconds timeout) {
  auto frames = Receive(sockets_->sub, timeout);
  if (!frames.ok()) return frames.status();
  if (frames->empty()) return std::optional<Message>();
  auto m = Parse(frames->data(), frames->size());
  if (!m.ok()) return m.status();
  return std::optional<Message>(std::move(m).value());
}

Result<std::vector<KvEventSubscriber::Message>> KvEventSubscriber::Replay(
    uint64_t start, std::chrono::milliseconds timeout) {
  if (!sockets_->replay) return Status::FailedPrecondition("no replay address was given");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  try {
    // A DEALER sends the empty delimiter a REQ would: the ROUTER sees [identity, '', start].
    const std::string seq = KvEventSequenceBytes(start);
    sockets_->replay->send(zmq::message_t(), zmq::send_flags::sndmore);
    sockets_->replay->send(zmq::buffer(seq), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("ZMQ: ") + e.what());
  }
  std::vector<Message> out;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    auto frames = Receive(*sockets_->replay, left);
    if (!frames.ok()) return frames.status();
    if (frames->empty()) break;
    // ['', topic, sequence, payload]; the end marker is ['', '', -1, ''].
    if (frames->size() != 4) {
      return Status::InvalidArgument("a replay message has " + std::to_string(frames->size()) +
                                     " frames, not 4");
    }
    if (KvEventSequenceFrom((*frames)[2].to_string_view()) == kKvEventReplayEnd) return out;
    auto m = Parse(frames->data() + 1, 3);
    if (!m.ok()) return m.status();
    out.push_back(std::move(m).value());
  }
  return Status::DeadlineExceeded("the replay's end marker did not come within " +
                                  std::to_string(timeout.count()) + " ms");
}

std::string ConnectableAddress(const std::string& bound) {
  for (const std::string wildcard : {"tcp://*:", "tcp://0.0.0.0:"}) {
    if (bound.rfind(wildcard, 0) == 0) return "tcp://127.0.0.1:" + bound.substr(wildcard.size());
  }
  if (bound.rfind("tcp://[::]:", 0) == 0) return "tcp://[::1]:" + bound.substr(11);
  return bound;
}

}  // namespace kvtier::tools
