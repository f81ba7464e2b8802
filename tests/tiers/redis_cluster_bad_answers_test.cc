// RedisCluster against a broken or hostile server (the remote store is not
// trusted, DESIGN.md "Threat model"): a TCP server that answers each command
// with scripted RESP bytes (short arrays, wrong types, garbage redirects,
// redirect loops, silence, a bulk string cut short). Every call must end in
// UNAVAILABLE naming the node and the fault, within the timeouts, without a
// crash or a byte written to dst.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status_printer.h"
#include "kvtier/tiers/redis_cluster.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// What to send back for one command (its words); "" sends nothing; kClose at the end closes
// the connection after sending what is before it.
using Script = std::function<std::string(const std::vector<std::string>& argv)>;
const std::string kClose = "<close>";
// At the start of an answer: send the rest one byte every 10 ms.
const std::string kDrip = "<drip>";
// At the start of an answer: send the rest, then 1 MiB after 1 MiB of 'x' as fast as the
// client reads (256 MiB at most) until it hangs up.
const std::string kFlood = "<flood>";

// A TCP server on 127.0.0.1 (a free port) that answers each command by its
// Script, one thread per connection. Thread-safety: constructed and destroyed
// by one thread; the script runs on the server's threads.
class ScriptedServer {
 public:
  explicit ScriptedServer(Script script) : script_(std::move(script)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_fd_, 16) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "ScriptedServer: cannot listen on 127.0.0.1";
      return;
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~ScriptedServer() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    for (auto& t : connections_) t.join();
    close(listen_fd_);
  }
  uint16_t port() const { return port_; }
  RedisEndpoint endpoint() const { return {"127.0.0.1", port_}; }

 private:
  // Waits until `fd` is readable or the server stops; false when stopping.
  bool WaitReadable(int fd) {
    pollfd p{fd, POLLIN, 0};
    while (!stop_) {
      if (poll(&p, 1, 20) > 0) return true;
    }
    return false;
  }
  void Accept() {
    while (WaitReadable(listen_fd_)) {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd >= 0) connections_.emplace_back([this, fd] { Serve(fd); });
    }
  }
  void Serve(int fd) {
    redisReader* reader = redisReaderCreate();
    char buf[4096];
    bool open = true;
    while (open && WaitReadable(fd)) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0 || redisReaderFeed(reader, buf, static_cast<size_t>(n)) != REDIS_OK) break;
      void* r = nullptr;
      while (open && redisReaderGetReply(reader, &r) == REDIS_OK && r != nullptr) {
        auto* reply = static_cast<redisReply*>(r);
        std::vector<std::string> argv;
        for (size_t i = 0; i < reply->elements; ++i) {
          argv.emplace_back(reply->element[i]->str, reply->element[i]->len);
        }
        freeReplyObject(reply);
        std::string answer = script_(argv);
        const bool close_after = answer.ends_with(kClose);
        if (close_after) answer.resize(answer.size() - kClose.size());
        if (answer.starts_with(kDrip)) {
          for (size_t i = kDrip.size(); open && !stop_ && i < answer.size(); ++i) {
            open = send(fd, &answer[i], 1, MSG_NOSIGNAL) == 1;
            std::this_thread::sleep_for(milliseconds(10));
          }
          continue;
        }
        if (answer.starts_with(kFlood)) {
          answer.erase(0, kFlood.size());
          open = send(fd, answer.data(), answer.size(), MSG_NOSIGNAL) >= 0;
          const std::string mib(1 << 20, 'x');
          for (int i = 0; open && !stop_ && i < 256; ++i) {
            open =
                send(fd, mib.data(), mib.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(mib.size());
          }
          continue;
        }
        if (!answer.empty() && send(fd, answer.data(), answer.size(), MSG_NOSIGNAL) < 0) {
          open = false;
        }
        if (close_after) open = false;
      }
    }
    redisReaderFree(reader);
    close(fd);
  }

  Script script_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::vector<std::thread> connections_;  // touched by the acceptor, then by ~ScriptedServer
};

RedisClusterOptions OptionsFor(const ScriptedServer& server) {
  RedisClusterOptions o;
  o.seeds = {server.endpoint()};
  o.io_timeout = milliseconds(200);
  o.connect_timeout = milliseconds(200);
  o.reconnect_backoff = milliseconds(0);
  o.topology_refresh = milliseconds(0);
  return o;
}

// GETs `key` into a guarded buffer; the result. Fails the test if a byte was written.
Status GetOne(RedisCluster& c, const std::string& key) {
  std::vector<std::byte> buf(64, std::byte{0x5A});
  RedisCluster::Get g{key, std::span(buf).first(32), 0, {}};
  c.GetMany({&g, 1});
  EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0x5A}; }))
      << key << ": bytes written on " << g.result.ToString();
  return g.result;
}

void ExpectUnavailable(const Status& s, const std::string& node, const std::string& what) {
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find(node), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
}

TEST(RedisClusterBadAnswers, MalformedClusterSlotsIsUnavailableNamingTheEntry) {
  const std::vector<std::string> answers = {
      "*1\r\n*2\r\n:0\r\n:16383\r\n",                              // no master
      "*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n",       // slot out of range
      "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$1\r\nh\r\n:70000\r\n",   // port out of range
      "*1\r\n*3\r\n$1\r\n0\r\n:16383\r\n*2\r\n$1\r\nh\r\n:1\r\n",  // slot as a string
      ":42\r\n",                                                   // not an array
  };
  const std::vector<std::string> why = {"entry 0", "entry 0", "entry 0", "entry 0", "not an array"};
  for (size_t i = 0; i < answers.size(); ++i) {
    ScriptedServer server([&](const std::vector<std::string>& argv) {
      return argv.at(0) == "CLUSTER" ? answers[i] : std::string("$-1\r\n");
    });
    auto c = RedisCluster::Create(OptionsFor(server));
    ASSERT_TRUE(c.ok());
    ExpectUnavailable(GetOne(**c, "k"), server.endpoint().ToString(), why[i]);
    EXPECT_FALSE((*c)->cluster_mode());
  }
}

TEST(RedisClusterBadAnswers, OddGetAnswersAreUnavailableAndBounded) {
  std::atomic<uint16_t> port{0};  // the server's, set before any command arrives
  ScriptedServer server([&](const std::vector<std::string>& argv) -> std::string {
    const std::string p = std::to_string(port.load());
    if (argv.at(0) == "CLUSTER") {  // one master for every slot: itself
      return "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:" + p + "\r\n$2\r\nid\r\n";
    }
    if (argv.at(0) == "ASKING") return "+OK\r\n";
    const std::string& key = argv.at(1);
    const std::string self = "127.0.0.1:" + p;
    if (key == "array") return "*2\r\n$1\r\na\r\n:1\r\n";
    if (key == "integer") return ":7\r\n";
    if (key == "garbage-moved") return "-MOVED x y\r\n";
    if (key == "moved-bad-port") return "-MOVED 5 127.0.0.1:0\r\n";
    if (key == "loop-moved") return "-MOVED 5 " + self + "\r\n";
    if (key == "loop-ask") return "-ASK 5 " + self + "\r\n";
    if (key == "silent") return "";
    if (key == "cut-short") return "$100\r\nabc";
    if (key == "closed") return kClose;
    return "$-1\r\n";
  });
  port = server.port();
  const std::string self = server.endpoint().ToString();
  RedisClusterOptions o = OptionsFor(server);
  auto c = RedisCluster::Create(o);
  ASSERT_TRUE(c.ok());
  RedisCluster& client = **c;
  EXPECT_EQ(GetOne(client, "missing").code(), StatusCode::kNotFound);
  EXPECT_TRUE(client.cluster_mode());
  ExpectUnavailable(GetOne(client, "array"), self, "array of 2");
  ExpectUnavailable(GetOne(client, "integer"), self, "integer 7");
  ExpectUnavailable(GetOne(client, "garbage-moved"), self, "MOVED x y");
  ExpectUnavailable(GetOne(client, "moved-bad-port"), self, "port '0'");

  const auto before = client.counters();
  ExpectUnavailable(GetOne(client, "loop-moved"), self, "max_redirects (5)");
  ExpectUnavailable(GetOne(client, "loop-ask"), self, "max_redirects (5)");
  EXPECT_EQ(client.counters().moved - before.moved, 5u);
  EXPECT_EQ(client.counters().ask - before.ask, 5u);

  for (const std::string key : {"silent", "cut-short"}) {
    const auto start = Clock::now();
    ExpectUnavailable(GetOne(client, key), self, "io_timeout (200 ms)");
    EXPECT_LT(Clock::now() - start, milliseconds(1500)) << key;
  }
  EXPECT_GE(client.counters().timeouts, 2u);
  ExpectUnavailable(GetOne(client, "closed"), self, "closed");
  // The connection each fault broke is replaced: a plain GET works again.
  EXPECT_EQ(GetOne(client, "missing").code(), StatusCode::kNotFound);
}

// Issue 32, item 6: a hostile or broken store cannot hold a call past its
// deadline by trickling bytes (each read used to have io_timeout of its own:
// a byte every 10 ms kept a GET going for as long as the server liked), nor
// grow kvtierd's memory without bound (a bulk string of gigabytes was
// buffered whole; an array's pointers are allocated when its length arrives).
// Other callers waiting for the node's one pooled connection are bounded too.
TEST(RedisClusterBadAnswers, ATricklingOrFloodingServerIsCutOffAtTheDeadlineAndTheBound) {
  ScriptedServer server([&](const std::vector<std::string>& argv) -> std::string {
    if (argv.at(0) == "CLUSTER") return "-ERR This instance has cluster support disabled\r\n";
    const std::string& key = argv.at(1);
    if (key == "drip") return kDrip + "$1000\r\n" + std::string(1000, 'd') + "\r\n";
    if (key == "flood") return kFlood + "$4000000000\r\n";
    if (key == "huge-array") return "*2000000000\r\n";
    return "$-1\r\n";
  });
  const std::string self = server.endpoint().ToString();
  RedisClusterOptions o = OptionsFor(server);
  o.pool_size = 1;
  auto c = RedisCluster::Create(o);
  ASSERT_TRUE(c.ok());
  RedisCluster& client = **c;
  auto start = Clock::now();
  ExpectUnavailable(GetOne(client, "drip"), self, "io_timeout (200 ms)");
  EXPECT_LT(Clock::now() - start, milliseconds(1000)) << "a trickle outlasted the deadline";
  start = Clock::now();
  ExpectUnavailable(GetOne(client, "flood"), self, "bytes (not read on)");
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
  ExpectUnavailable(GetOne(client, "huge-array"), self, "an array of 2000000000 elements");
  // Two callers on one pooled connection, the first held by a trickle: each
  // ends within its own deadline (the second's wait for the connection counts).
  start = Clock::now();
  Status second;
  std::thread other([&] {
    std::this_thread::sleep_for(milliseconds(20));
    second = GetOne(client, "missing");
  });
  const Status first = GetOne(client, "drip");
  other.join();
  ExpectUnavailable(first, self, "io_timeout");
  EXPECT_TRUE(second.code() == StatusCode::kUnavailable || second.code() == StatusCode::kNotFound)
      << second.ToString();
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
  EXPECT_EQ(GetOne(client, "missing").code(), StatusCode::kNotFound) << "not usable again";
}

TEST(RedisClusterBadAnswers, UnreachableSeedIsUnavailableAtOnceAndNotAnError) {
  uint16_t port = 0;
  {
    ScriptedServer closed([](const std::vector<std::string>&) { return std::string(); });
    port = closed.port();
  }  // nothing listens on `port` any more
  RedisClusterOptions o;
  o.seeds = {{"127.0.0.1", port}};
  o.reconnect_backoff = milliseconds(10000);
  auto c = RedisCluster::Create(o);
  ASSERT_TRUE(c.ok()) << "Create connects to nothing";
  const Status first = GetOne(**c, "k");
  ExpectUnavailable(first, "127.0.0.1:" + std::to_string(port), "connect");
  const Status second = GetOne(**c, "k");
  ExpectUnavailable(second, "127.0.0.1:" + std::to_string(port), "reconnect_backoff");
  EXPECT_EQ((*c)->counters().connect_failures, 1u) << "the backoff holds the second attempt";
}

TEST(RedisClusterBadAnswers, ServerClosingMidBatchIsUnavailableNotSigpipe) {
  // The server hangs up a pooled connection after answering on it; the next batch's first
  // write fills the socket buffer, the server's RST follows, and the next write fails with
  // EPIPE, which must not raise SIGPIPE (it ends a process that did not ignore it, as this
  // test's does not). Also: the server hangs up while a batch is being written.
  ScriptedServer server([](const std::vector<std::string>& argv) -> std::string {
    if (argv.at(0) == "CLUSTER") return "-ERR This instance has cluster support disabled\r\n";
    if (argv.at(0) == "GET") return "$-1\r\n" + kClose;
    return kClose;
  });
  auto c = RedisCluster::Create(OptionsFor(server));
  ASSERT_TRUE(c.ok());
  std::vector<std::byte> buf(8);
  RedisCluster::Get g{"k", buf, 0, {}};
  (*c)->GetMany({&g, 1});
  ASSERT_EQ(g.result.code(), StatusCode::kNotFound) << g.result.ToString();
  std::this_thread::sleep_for(milliseconds(50));  // the server has closed the pooled connection
  const std::vector<std::byte> value(1 << 20, std::byte{7});
  std::vector<std::string> keys;
  for (int i = 0; i < 32; ++i) keys.push_back("big/" + std::to_string(i));
  std::vector<RedisCluster::Set> sets;
  for (const auto& k : keys) sets.push_back({k, value, {}});
  for (int round = 0; round < 3; ++round) {
    (*c)->SetMany(sets);
    for (const auto& s : sets) {
      EXPECT_EQ(s.result.code(), StatusCode::kUnavailable) << s.result.ToString();
    }
  }
  EXPECT_FALSE((*c)->cluster_mode());
}

}  // namespace
}  // namespace kvtier
