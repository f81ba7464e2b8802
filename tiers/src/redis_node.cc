#include "redis_node.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace kvtier::redis {
namespace {

timeval ToTimeval(std::chrono::microseconds d) {
  if (d < std::chrono::milliseconds(1)) d = std::chrono::milliseconds(1);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(d.count() / 1000000);
  tv.tv_usec = static_cast<suseconds_t>(d.count() % 1000000);
  return tv;
}

std::string Escaped(const char* s, size_t len) {
  constexpr size_t kMax = 64;
  std::string out;
  for (size_t i = 0; i < len && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (len > kMax) out += "...";
  return out;
}

// hiredis's own reply functions, and createArray bounded by the answer's
// element budget (RedisConnection::Bound, in the reader's privdata): an array
// whose announced length is over it fails the answer (NULL: hiredis's
// out-of-memory error) before hiredis allocates its pointers.
template <typename F>
struct CountOf;
template <typename R, typename T, typename N>
struct CountOf<R (*)(T, N)> {
  using type = N;
};
using ElementCount = CountOf<decltype(redisReplyObjectFunctions::createArray)>::type;

const redisReplyObjectFunctions* g_hiredis_functions = nullptr;

void* CreateBoundedArray(const redisReadTask* task, ElementCount elements) {
  auto* budget = static_cast<RedisConnection::ElementBudget*>(task->privdata);
  const auto n = static_cast<size_t>(elements < 0 ? 0 : elements);
  if (budget == nullptr || n > budget->left) {
    if (budget != nullptr) budget->refused = n;
    return nullptr;
  }
  budget->left -= n;
  return g_hiredis_functions->createArray(task, elements);
}

redisReplyObjectFunctions* BoundedFunctions(const redisReplyObjectFunctions* hiredis) {
  static redisReplyObjectFunctions bounded = [&] {
    g_hiredis_functions = hiredis;
    redisReplyObjectFunctions f = *hiredis;
    f.createArray = &CreateBoundedArray;
    return f;
  }();
  return &bounded;
}

}  // namespace

std::string DescribeReply(const redisReply& r) {
  const size_t len = r.str != nullptr ? r.len : 0;
  switch (r.type) {
    case REDIS_REPLY_STRING:
      return "string '" + Escaped(r.str, len) + "'";
    case REDIS_REPLY_STATUS:
      return "status '" + Escaped(r.str, len) + "'";
    case REDIS_REPLY_ERROR:
      return "error '" + Escaped(r.str, len) + "'";
    case REDIS_REPLY_INTEGER:
      return "integer " + std::to_string(r.integer);
    case REDIS_REPLY_ARRAY:
      return "array of " + std::to_string(r.elements);
    case REDIS_REPLY_NIL:
      return "nil";
    default:
      return "answer of type " + std::to_string(r.type);
  }
}

RedisConnection::RedisConnection(RedisConnection&& other) noexcept { *this = std::move(other); }

RedisConnection& RedisConnection::operator=(RedisConnection&& other) noexcept {
  if (this != &other) {
    GiveBack();
    node_ = std::exchange(other.node_, nullptr);
    ctx_ = std::exchange(other.ctx_, nullptr);
    reused_ = other.reused_;
    broken_ = other.broken_;
    out_ = std::move(other.out_);
    framing_ = std::move(other.framing_);
    out_next_ = std::exchange(other.out_next_, 0);
    out_sent_ = std::exchange(other.out_sent_, 0);
  }
  return *this;
}

RedisConnection::~RedisConnection() { GiveBack(); }

void RedisConnection::GiveBack() {
  // A command not wholly sent leaves the stream mid-command: closed, as a broken one.
  if (ctx_ != nullptr) node_->Return(ctx_, broken_ || out_next_ < out_.size());
  ctx_ = nullptr;
}

void RedisConnection::Append(int argc, const char* const* argv, const size_t* argv_len) {
  // RESP: an array of bulk strings. Headers and short arguments are copied into
  // framing_; a long argument (an image) is sent from the caller's memory.
  constexpr size_t kCopyBelow = 4096;
  const auto frame = [&](std::string_view text) {
    if (!out_.empty() && out_.back().ptr == nullptr) {
      out_.back().len += text.size();
    } else {
      out_.push_back({nullptr, framing_.size(), text.size()});
    }
    framing_.append(text);
  };
  frame("*" + std::to_string(argc) + "\r\n");
  for (int i = 0; i < argc; ++i) {
    frame("$" + std::to_string(argv_len[i]) + "\r\n");
    if (argv_len[i] < kCopyBelow) {
      frame(std::string_view(argv[i], argv_len[i]));
    } else {
      out_.push_back({argv[i], 0, argv_len[i]});
    }
    frame("\r\n");
  }
}

int RedisConnection::WriteSome(std::string* error) {
  constexpr size_t kMaxIov = 64;
  iovec iov[kMaxIov];
  size_t n = 0;
  for (size_t i = out_next_; i < out_.size() && n < kMaxIov; ++i) {
    const Segment& seg = out_[i];
    const char* base = seg.ptr != nullptr ? seg.ptr : framing_.data() + seg.offset;
    const size_t skip = i == out_next_ ? out_sent_ : 0;
    iov[n++] = {const_cast<char*>(base + skip), seg.len - skip};
  }
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = n;
  // MSG_NOSIGNAL: a write to a connection the server reset raises no SIGPIPE.
  const ssize_t wrote = sendmsg(ctx_->fd, &msg, MSG_NOSIGNAL);
  if (wrote < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    *error = std::strerror(errno);
    return -1;
  }
  // Past what was sent: no byte of the queue is moved (a batch of images is
  // sent from where it lies, whatever pieces the socket takes).
  auto left = static_cast<size_t>(wrote);
  while (left > 0) {
    const size_t rest = out_[out_next_].len - out_sent_;
    if (left < rest) {
      out_sent_ += left;
      break;
    }
    left -= rest;
    ++out_next_;
    out_sent_ = 0;
  }
  if (out_next_ == out_.size()) {
    out_.clear();
    framing_.clear();
    out_next_ = 0;
  }
  return 1;
}

Status RedisConnection::ReadReply(Clock::time_point deadline, Reply* reply, bool* timed_out,
                                  Bound bound) {
  *timed_out = false;
  reply->reset();
  if (broken_) {
    return Status::Unavailable(node_->name() + ": the connection broke: " + ctx_->errstr);
  }
  budget_ = {bound.elements, 0};
  ctx_->reader->privdata = &budget_;
  // Bytes received for this answer: the answer itself, and what the last read
  // brought of the next ones (a read takes at most kReadBytes).
  constexpr size_t kReadBytes = size_t{64} << 10;
  thread_local std::unique_ptr<char[]> buffer;
  if (!buffer) buffer = std::make_unique<char[]>(kReadBytes);
  char* const buf = buffer.get();
  size_t received = 0;
  // Whether a write or a read may make progress without a poll: tried first.
  bool may_read = true, may_write = true;
  void* r = nullptr;
  Status st;
  for (;;) {
    // An answer already read (pipelined) needs no system call.
    if (redisGetReplyFromReader(ctx_, &r) != REDIS_OK) {
      st = Status::Unavailable(node_->name() + ": protocol error: " +
                               (budget_.refused == 0
                                    ? std::string(ctx_->errstr)
                                    : "an array of " + std::to_string(budget_.refused) +
                                          " elements, where at most " +
                                          std::to_string(bound.elements) + " may come"));
      break;
    }
    if (r != nullptr) break;
    if (received > bound.bytes + kReadBytes) {
      st = Status::Unavailable(node_->name() + ": an answer of more than " +
                               std::to_string(bound.bytes) + " bytes (not read on)");
      break;
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      *timed_out = true;
      st = Status::Unavailable(node_->name() + ": no answer within io_timeout (" +
                               std::to_string(node_->options().io_timeout.count()) + " ms)");
      break;
    }
    const bool writing = out_next_ < out_.size();
    // Polled only once the socket took no more and had nothing to read: a
    // stream of answers is read without a poll per read.
    if (!may_read && !(writing && may_write)) {
      pollfd p{ctx_->fd, static_cast<short>(POLLIN | (writing ? POLLOUT : 0)), 0};
      const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 60'000)));
      if (n < 0 && errno != EINTR) {
        st = Status::Unavailable(node_->name() + ": I/O error: poll: " + std::strerror(errno));
        break;
      }
      if (n <= 0) continue;
      may_write = (p.revents & POLLOUT) != 0;
      may_read = (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    }
    if (writing && may_write) {
      std::string error;
      const int wrote = WriteSome(&error);
      if (wrote < 0) {
        st = Status::Unavailable(node_->name() + ": I/O error: " + error);
        break;
      }
      may_write = wrote > 0;
    }
    if (may_read) {
      const ssize_t got = read(ctx_->fd, buf, kReadBytes);
      if (got == 0) {
        st = Status::Unavailable(node_->name() + ": connection closed by the server");
        break;
      }
      if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        st = Status::Unavailable(node_->name() + ": I/O error: " + std::strerror(errno));
        break;
      }
      may_read = got > 0;
      if (got > 0) {
        received += static_cast<size_t>(got);
        if (redisReaderFeed(ctx_->reader, buf, static_cast<size_t>(got)) != REDIS_OK) {
          st = Status::Unavailable(node_->name() + ": protocol error: " + ctx_->reader->errstr);
          break;
        }
      }
    }
  }
  ctx_->reader->privdata = nullptr;
  if (r != nullptr) {
    reply->reset(static_cast<redisReply*>(r));
    return Status::Ok();
  }
  broken_ = true;
  return st;
}

RedisNode::RedisNode(RedisEndpoint endpoint, const RedisNodeOptions& options,
                     AtomicCounters* counters)
    : endpoint_(std::move(endpoint)),
      name_(endpoint_.ToString()),
      options_(options),
      counters_(counters) {}

RedisNode::~RedisNode() { DropIdle(); }

Result<RedisConnection> RedisNode::Borrow(Clock::time_point deadline) {
  {
    std::unique_lock lock(mu_);
    if (!returned_.wait_until(lock, deadline,
                              [&] { return !idle_.empty() || num_open_ < options_.pool_size; })) {
      return Status::Unavailable(name_ + ": no pooled connection free within io_timeout (" +
                                 std::to_string(options_.io_timeout.count()) + " ms; " +
                                 std::to_string(options_.pool_size) + " all lent)");
    }
    if (!idle_.empty()) {
      redisContext* ctx = idle_.back();
      idle_.pop_back();
      return RedisConnection(this, ctx, /*reused=*/true);
    }
    if (failed_ && Clock::now() - failed_at_ < options_.reconnect_backoff) {
      return Status::Unavailable(name_ + ": not reconnecting within reconnect_backoff (" +
                                 std::to_string(options_.reconnect_backoff.count()) +
                                 " ms) of a failed connect: " + last_error_);
    }
    ++num_open_;
  }
  return Connect();
}

Result<RedisConnection> RedisNode::Connect() {
  const timeval connect_tv = ToTimeval(options_.connect_timeout);
  redisContext* ctx = redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port, connect_tv);
  // Non-blocking from here on: ReadReply polls, so that no read or write can
  // outlast its deadline by trickling bytes; arrays are bounded (above).
  if (ctx != nullptr && ctx->err == 0 &&
      redisSetTimeout(ctx, ToTimeval(options_.io_timeout)) == REDIS_OK &&
      fcntl(ctx->fd, F_SETFL, fcntl(ctx->fd, F_GETFL) | O_NONBLOCK) == 0) {
    ctx->flags &= ~REDIS_BLOCK;
    ctx->reader->fn = BoundedFunctions(ctx->reader->fn);
    counters_->connects.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lock(mu_);
    failed_ = false;
    return RedisConnection(this, ctx, /*reused=*/false);
  }
  std::string why = ctx == nullptr ? "out of memory" : ctx->errstr;
  if (ctx != nullptr) redisFree(ctx);
  counters_->connect_failures.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(mu_);
    --num_open_;
    failed_ = true;
    failed_at_ = Clock::now();
    last_error_ = why;
  }
  returned_.notify_one();
  return Status::Unavailable(name_ + ": connect failed: " + why);
}

void RedisNode::Return(redisContext* ctx, bool broken) {
  {
    std::lock_guard lock(mu_);
    if (broken || ctx->err != 0) {
      --num_open_;
    } else {
      idle_.push_back(ctx);
      ctx = nullptr;
    }
  }
  if (ctx != nullptr) redisFree(ctx);
  returned_.notify_one();
}

void RedisNode::DropIdle() {
  std::vector<redisContext*> idle;
  {
    std::lock_guard lock(mu_);
    idle.swap(idle_);
    num_open_ -= static_cast<uint32_t>(idle.size());
  }
  for (redisContext* ctx : idle) redisFree(ctx);
  returned_.notify_all();
}

}  // namespace kvtier::redis
