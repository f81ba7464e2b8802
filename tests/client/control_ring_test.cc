// The control ring (kvtier/control_ring.h) against a real kvtierd: the SDK's
// Lookups go over it with the answers gRPC gives, and kvtierd treats a ring
// as hostile: a client that scribbles over its own ring gets errors or
// nothing, while other sessions keep being served.
#include "kvtier/control_ring.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "kvtier/fd_passing.h"
#include "kvtier/proto/convert.h"
#include "kvtier/proto/transport_args.h"
#include "kvtier/tools/model_presets.h"
#include "kvtier/tools/synthetic_kv.h"
#include "kvtier/v1/kvtier.grpc.pb.h"
#include "testing/daemon_process.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using testing::TempDir;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr uint32_t kChunkTokens = 16;

NamespaceSpec TinySpec() {
  auto spec = tools::ModelPreset("tiny", kChunkTokens);  // 8 KiB per chunk
  EXPECT_TRUE(spec.ok());
  return *spec;
}

std::vector<int32_t> Tokens(uint32_t stream, size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((stream * 7919u + i * 131u) % 128000);
  return t;
}

class ControlRingTest : public ::testing::Test {
 protected:
  ControlRingTest()
      : socket_(dir_.Sub("run/kvtierd.sock")), daemon_([&] {
          DaemonProcess::Options o;
          o.socket_path = socket_;
          o.dram_bytes = "64MiB";
          o.log_path = dir_.Sub("kvtierd.log");
          return o;
        }()) {}

  void SetUp() override { ASSERT_EQ(daemon_.Start(), ""); }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s\n", daemon_.log().c_str());
  }

  std::unique_ptr<Client> Connect(bool ring) {
    ClientOptions o;
    o.socket_path = socket_;
    o.deadline = 2000ms;
    o.connect_timeout = 5000ms;
    o.control_ring = ring;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  uint64_t RingStat(const char* name) {
    auto r = daemon_.Ctl({"--json", "stats"});
    EXPECT_TRUE(r.ok()) << r.Describe();
    return nlohmann::json::parse(r.out, nullptr, false).value(name, uint64_t{0});
  }
  uint64_t RingLookups() { return RingStat("ring_lookups"); }

  // Stores `tokens`' chunks through `c`, then loads them and counts wrong bytes.
  void StoreAndVerify(Client& c, const NamespaceHandle& ns, const std::vector<int32_t>& tokens) {
    const auto keys = Client::ChunkKeys(ns, tokens);
    const uint64_t pb = ns.layout.payload_bytes;
    std::vector<std::byte> src(keys.size() * pb);
    for (size_t i = 0; i < keys.size(); ++i) {
      tools::FillPayload(keys[i], ns.spec.num_layers, std::span(src.data() + i * pb, pb));
    }
    auto stored = c.Store(ns, tokens, std::span<const std::byte>(src));
    ASSERT_TRUE(stored.ok() && stored->fail_open.ok());
    std::vector<std::byte> dst(src.size());
    auto loaded = c.Load(ns, tokens, dst);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    ASSERT_TRUE(loaded->fail_open.ok()) << loaded->fail_open.ToString();
    ASSERT_EQ(loaded->num_chunks, keys.size());
    uint64_t errors = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      errors += tools::CountPayloadErrors(keys[i], ns.spec.num_layers,
                                          std::span<const std::byte>(dst.data() + i * pb, pb));
    }
    EXPECT_EQ(errors, 0u);
  }

  TempDir dir_;
  std::string socket_;
  DaemonProcess daemon_;
};

// A raw session (its own Session stream, as an engine's client would open it)
// and its ring, mapped here, for writing entries by hand.
struct RawSession {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::KvCache::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionHello, v1::SessionOpened>> stream;
  v1::SessionOpened opened;

  explicit RawSession(const std::string& socket) {
    channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
    stub = v1::KvCache::NewStub(channel);
    stream = stub->Session(&ctx);
    v1::SessionHello hello;
    hello.set_client_name("control_ring_test raw");
    hello.set_pid(static_cast<uint32_t>(getpid()));
    EXPECT_TRUE(stream->Write(hello));
    EXPECT_TRUE(stream->Read(&opened));
  }
  ~RawSession() { ctx.TryCancel(); }
};

// Submits slot `slot` (its entry already written) and waits up to `wait` for
// the daemon's answer to `seq`; nullopt when none came.
std::optional<RingCompletion> Submit(RingMemory& ring, uint32_t slot, uint32_t seq,
                                     std::chrono::milliseconds wait = 2000ms) {
  RingHeader& h = ring.header();
  const uint32_t tail = h.sq_tail.load();
  h.sq[tail % kRingDepth].store(slot);
  h.sq_tail.store(tail + 1);
  RingFutexWake(h.sq_tail);
  for (const auto until = Clock::now() + wait; Clock::now() < until;) {
    if (ring.slot(slot).done.load() == seq) {
      RingCompletion c;
      std::memcpy(&c, &ring.slot(slot).completion, sizeof(c));
      return c;
    }
    std::this_thread::sleep_for(1ms);
  }
  return std::nullopt;
}

TEST_F(ControlRingTest, LookupsGoOverTheRingAndAnswerAsGrpcDoes) {
  auto ringed = Connect(/*ring=*/true);
  auto plain = Connect(/*ring=*/false);
  ASSERT_TRUE(ringed && plain);
  auto ns_r = ringed->OpenNamespace(TinySpec());
  auto ns_p = plain->OpenNamespace(TinySpec());
  ASSERT_TRUE(ns_r.ok() && ns_p.ok());
  const auto tokens = Tokens(1, 10 * kChunkTokens + 5);
  const uint64_t before = RingLookups();
  const uint64_t calls_before = RingStat("ring_calls");
  ASSERT_NO_FATAL_FAILURE(StoreAndVerify(*ringed, *ns_r, tokens));  // one Load: one ring Lookup
  EXPECT_EQ(RingLookups(), before + 1);
  // ReserveWrite, CommitWrite, the Lookup and (sent before Load returned) its release.
  EXPECT_EQ(RingStat("ring_calls"), calls_before + 4);
  ASSERT_NO_FATAL_FAILURE(StoreAndVerify(*plain, *ns_p, Tokens(5, 3 * kChunkTokens)));
  EXPECT_EQ(RingStat("ring_calls"), calls_before + 4) << "the plain client used the ring";

  for (size_t prefix :
       {size_t{0}, size_t{kChunkTokens - 1}, size_t{3 * kChunkTokens + 2}, tokens.size()}) {
    const std::span<const int32_t> p(tokens.data(), prefix);
    auto a = ringed->Lookup(*ns_r, p);
    auto b = plain->Lookup(*ns_p, p);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(a->fail_open.ok()) << a->fail_open.ToString();
    EXPECT_EQ(a->num_chunks, b->num_chunks) << prefix << " tokens";
    EXPECT_EQ(a->num_chunks, prefix / kChunkTokens);
  }
  EXPECT_EQ(RingLookups(), before + 5) << "the plain client's Lookups went over gRPC";
}

// KVTIER_CONTROL_RING's off values count in any case (OFF, False).
TEST_F(ControlRingTest, TheEnvironmentTurnsTheRingOffInAnyCase) {
  for (const char* off : {"OFF", "False", "No"}) {
    setenv("KVTIER_CONTROL_RING", off, 1);
    auto c = Connect(/*ring=*/true);
    unsetenv("KVTIER_CONTROL_RING");
    ASSERT_TRUE(c);
    auto ns = c->OpenNamespace(TinySpec());
    ASSERT_TRUE(ns.ok());
    const uint64_t calls = RingStat("ring_calls");
    ASSERT_NO_FATAL_FAILURE(StoreAndVerify(*c, *ns, Tokens(60, 2 * kChunkTokens)));
    EXPECT_EQ(RingStat("ring_calls"), calls)
        << "KVTIER_CONTROL_RING=" << off << " left the ring on";
  }
}

// A value that is neither on nor off is warned about, naming it, and changes
// nothing. It used to be taken silently (a typo left the ring on unnoticed).
TEST_F(ControlRingTest, AnUnknownEnvironmentValueIsWarnedAboutAndLeavesTheRingOn) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  setenv("KVTIER_CONTROL_RING", "disabled", 1);
  auto c = Connect(/*ring=*/true);
  unsetenv("KVTIER_CONTROL_RING");
  spdlog::default_logger()->sinks().pop_back();
  ASSERT_TRUE(c);
  EXPECT_NE(log.str().find("KVTIER_CONTROL_RING='disabled'"), std::string::npos) << log.str();
  auto ns = c->OpenNamespace(TinySpec());
  ASSERT_TRUE(ns.ok());
  const uint64_t calls = RingStat("ring_calls");
  ASSERT_NO_FATAL_FAILURE(StoreAndVerify(*c, *ns, Tokens(70, 2 * kChunkTokens)));
  EXPECT_GT(RingStat("ring_calls"), calls) << "an unknown value turned the ring off";
}

// kvtierd's threads (from /proc/<pid>/status).
int DaemonThreads(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// Many sessions' rings are served by a few threads, not one each: a thread
// per ring put more spinners than cores on a small machine (8 clients on 2
// cores got half of one client's lookups/s). Every ring is still served, and
// the rings of ended sessions are let go.
TEST_F(ControlRingTest, ManyRingsShareAFewThreadsAndAreAllServed) {
  auto first = Connect(/*ring=*/true);  // kvtierd's gRPC and first ring threads exist now
  ASSERT_TRUE(first);
  auto ns0 = first->OpenNamespace(TinySpec());
  ASSERT_TRUE(ns0.ok());
  ASSERT_NO_FATAL_FAILURE(StoreAndVerify(*first, *ns0, Tokens(40, 2 * kChunkTokens)));
  const int threads_before = DaemonThreads(daemon_.pid());
  ASSERT_GT(threads_before, 0);
  constexpr int kSessions = 24;
  std::vector<std::unique_ptr<Client>> clients;
  const uint64_t before = RingLookups();
  for (int i = 0; i < kSessions; ++i) {
    clients.push_back(Connect(/*ring=*/true));
    ASSERT_TRUE(clients.back());
    auto ns = clients.back()->OpenNamespace(TinySpec());
    ASSERT_TRUE(ns.ok());
    ASSERT_NO_FATAL_FAILURE(StoreAndVerify(*clients.back(), *ns, Tokens(41 + i, 2 * kChunkTokens)));
  }
  EXPECT_EQ(RingLookups(), before + kSessions) << "some sessions' Loads did not use their ring";
  const int threads_after = DaemonThreads(daemon_.pid());
  // The cores' half in pollers at most, and some slack for gRPC's own pool.
  EXPECT_LE(threads_after - threads_before,
            static_cast<int>(std::thread::hardware_concurrency() / 2) + 4)
      << kSessions << " rings took " << threads_after - threads_before << " more threads";
  clients.clear();  // their sessions end; their rings are let go
  auto last = Connect(/*ring=*/true);
  ASSERT_TRUE(last);
  auto ns = last->OpenNamespace(TinySpec());
  ASSERT_TRUE(ns.ok());
  const uint64_t calls = RingStat("ring_calls");
  ASSERT_NO_FATAL_FAILURE(StoreAndVerify(*last, *ns, Tokens(99, 2 * kChunkTokens)));
  EXPECT_GE(RingStat("ring_calls"), calls + 3) << "a ring after many ended ones was not served";
}

// Peers that connect to the ring socket and never say hello hold up no one:
// a client that connects meanwhile still gets its ring, at once.
TEST_F(ControlRingTest, SilentPeersOnTheRingSocketKeepNoOneOffTheRing) {
  std::vector<int> silent;
  for (int i = 0; i < 20; ++i) {
    auto fd = ConnectUnixSocket(RingSocketPath(socket_), 1000);
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    silent.push_back(*fd);
  }
  const auto start = Clock::now();
  auto c = Connect(/*ring=*/true);
  const auto took = Clock::now() - start;
  ASSERT_TRUE(c);
  EXPECT_LT(took, 1s) << "connecting waited behind the silent peers";
  auto ns = c->OpenNamespace(TinySpec());
  ASSERT_TRUE(ns.ok());
  const uint64_t before = RingStat("ring_calls");
  ASSERT_NO_FATAL_FAILURE(StoreAndVerify(*c, *ns, Tokens(6, 4 * kChunkTokens)));
  EXPECT_GE(RingStat("ring_calls"), before + 3) << "the client got no ring";
  for (int fd : silent) close(fd);
}

TEST_F(ControlRingTest, ARingIsHandedOnlyToItsSessionsToken) {
  RawSession raw(socket_);
  std::string wrong = raw.opened.session_token();
  wrong[0] = wrong[0] == 'a' ? 'b' : 'a';
  auto refused = RequestRingFd(socket_, raw.opened.session_id(), wrong, 2000);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  auto unknown =
      RequestRingFd(socket_, raw.opened.session_id() + 1000, raw.opened.session_token(), 2000);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kFailedPrecondition);
  auto fd = RequestRingFd(socket_, raw.opened.session_id(), raw.opened.session_token(), 2000);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  auto ring = RingMemory::Map(*fd, raw.opened.session_id());
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  EXPECT_EQ(ring->header().session_id, raw.opened.session_id());
}

TEST_F(ControlRingTest, AScribblingClientGetsErrorsAndOtherSessionsKeepServing) {
  auto good = Connect(/*ring=*/true);
  ASSERT_TRUE(good);
  auto ns = good->OpenNamespace(TinySpec());
  ASSERT_TRUE(ns.ok());
  const auto stored = Tokens(2, 8 * kChunkTokens);
  ASSERT_NO_FATAL_FAILURE(StoreAndVerify(*good, *ns, stored));

  RawSession raw(socket_);
  auto fd = RequestRingFd(socket_, raw.opened.session_id(), raw.opened.session_token(), 2000);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  // The client holds a writable fd, but the ring is sealed: no SIGBUS for kvtierd.
  EXPECT_NE(ftruncate(*fd, 0), 0) << "the client shrank its ring";
  auto mapped = RingMemory::Map(*fd, raw.opened.session_id());
  ASSERT_TRUE(mapped.ok());
  RingMemory& ring = *mapped;
  uint32_t seq = 100;
  auto write = [&](uint32_t slot, RingSubmission e) {
    e.seq = ++seq;
    ring.slot(slot).done.store(0);
    std::memcpy(static_cast<void*>(&ring.slot(slot).submission), &e, sizeof(e));
    return e.seq;
  };
  // A Lookup with acquire of the stored prompt, in this raw session's namespace.
  auto lookup = [&] {
    RingSubmission e;
    e.op = static_cast<uint32_t>(RingOp::kLookup);
    e.flags = kRingAcquire;
    e.token_count = stored.size();
    ns->id.ToBytes(reinterpret_cast<std::byte*>(e.namespace_id));
    return e;
  };
  auto put_tokens = [&](uint32_t slot) {
    std::memcpy(ring.data(slot).data(), stored.data(), stored.size() * sizeof(int32_t));
  };

  RingSubmission e;  // an unknown op
  e.op = 77;
  uint32_t s = write(0, e);
  auto c = Submit(ring, 0, s);
  ASSERT_TRUE(c.has_value()) << "no answer to a bad op";
  EXPECT_EQ(c->code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  const std::string text(reinterpret_cast<const char*>(ring.data(0).data()), c->message_bytes);
  EXPECT_NE(text.find("op 77"), std::string::npos) << text;

  e = lookup();  // more tokens than the slot holds
  e.token_count = kRingSlotDataBytes;
  s = write(1, e);
  c = Submit(ring, 1, s);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  e.token_count = UINT32_MAX;  // token_count * 4 wraps around in 32 bits
  s = write(2, e);
  c = Submit(ring, 2, s);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->code, static_cast<int32_t>(StatusCode::kInvalidArgument));

  // Well-formed, but of a namespace no session opened: CacheCore's own error.
  e = lookup();
  std::memset(e.namespace_id, 0x3C, sizeof(e.namespace_id));
  s = write(3, e);
  put_tokens(3);
  c = Submit(ring, 3, s);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->code, static_cast<int32_t>(StatusCode::kNotFound));
  EXPECT_EQ(c->lease_id, 0u);
  const std::string not_found(reinterpret_cast<const char*>(ring.data(3).data()), c->message_bytes);
  EXPECT_NE(not_found.find("unknown (call OpenNamespace)"), std::string::npos) << not_found;

  s = write(3, lookup());
  put_tokens(3);
  c = Submit(ring, 3, s);
  ASSERT_TRUE(c.has_value());
  ASSERT_EQ(c->code, 0);
  EXPECT_EQ(c->num_chunks, 8u);
  EXPECT_NE(c->lease_id, 0u);
  EXPECT_EQ(c->location_count, 8u);
  RingSubmission release;
  release.op = static_cast<uint32_t>(RingOp::kReleaseRead);
  release.lease_id = c->lease_id;
  s = write(4, release);
  c = Submit(ring, 4, s);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->code, 0);

  // A call its client gave up on before kvtierd took it is not run at all.
  const auto leases = [&] {
    auto r = daemon_.Ctl({"--json", "stats"});
    return nlohmann::json::parse(r.out, nullptr, false).value("active_leases", uint64_t{99});
  };
  ASSERT_EQ(leases(), 0u);
  s = write(5, lookup());
  put_tokens(5);
  ASSERT_TRUE(RingGiveUp(ring.slot(5)));
  c = Submit(ring, 5, s);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->code, static_cast<int32_t>(StatusCode::kCancelled));
  EXPECT_EQ(c->lease_id, 0u);
  EXPECT_EQ(leases(), 0u) << "the abandoned call's lease was kept";

  // A slot index past the ring: no slot to answer into; the ring still serves.
  RingHeader& h = ring.header();
  h.sq[h.sq_tail.load() % kRingDepth].store(1000);
  h.sq_tail.fetch_add(1);
  RingFutexWake(h.sq_tail);
  s = write(6, release);
  c = Submit(ring, 6, s);
  ASSERT_TRUE(c.has_value()) << "one bad index stopped the ring";

  // Submission entries scribbled over: each gets an error, and a good call after them works.
  for (uint32_t slot = 7; slot < 12; ++slot) {
    std::memset(static_cast<void*>(&ring.slot(slot).submission), 0xA5, sizeof(RingSubmission));
    const uint32_t garbage_seq = ring.slot(slot).submission.seq;
    c = Submit(ring, slot, garbage_seq);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  }
  s = write(12, lookup());
  put_tokens(12);
  c = Submit(ring, 12, s);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->num_chunks, 8u);
  ASSERT_NO_FATAL_FAILURE(StoreAndVerify(*good, *ns, Tokens(3, 6 * kChunkTokens)));

  // A tail far ahead of what kvtierd took: the ring is closed, and says so.
  h.sq_tail.fetch_add(100000);
  RingFutexWake(h.sq_tail);
  for (auto until = Clock::now() + 2s; Clock::now() < until && h.closed.load() == 0;) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(h.closed.load(), 1u);
  s = write(13, release);
  EXPECT_FALSE(Submit(ring, 13, s, 300ms).has_value()) << "a ring past repair was served";
  ASSERT_NO_FATAL_FAILURE(StoreAndVerify(*good, *ns, Tokens(4, 5 * kChunkTokens)));
  auto health = daemon_.Ctl({"health"});
  EXPECT_TRUE(health.ok()) << health.Describe();
}

}  // namespace
}  // namespace kvtier
