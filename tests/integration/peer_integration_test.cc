// Who may connect to kvtierd (DESIGN.md "Threat model"; issue 10, item 11):
// both sockets are 0600 whatever the umask, every peer's uid is checked with
// SO_PEERCRED, and a socket directory other users can write to is refused.
// The peer checks need root (to connect as another uid); they skip otherwise.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include "integration/daemon_test_fixture.h"
#include "kvtier/proto/status_mapping.h"
#include "kvtier/proto/transport_args.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier::integration {
namespace {

using PeerTest = DaemonTest;

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0;
}

TEST_F(PeerTest, BothSocketsAre0600WhateverTheUmask) {
  const mode_t old = umask(0);  // kvtierd inherits it: 0777 sockets on the old code
  DaemonProcess daemon(Opts());
  const std::string started = daemon.Start();
  umask(old);
  ASSERT_EQ(started, "");
  EXPECT_EQ(ModeOf(socket_), 0600u) << std::oct << ModeOf(socket_);
  EXPECT_EQ(ModeOf(socket_ + ".arena"), 0600u) << std::oct << ModeOf(socket_ + ".arena");
}

TEST_F(PeerTest, APeerOfAnotherUidIsRefusedOnBothSockets) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");
  // Open the way through the file system, as a careless operator might: only
  // the peer check stands between uid 65534 and the daemon now.
  for (const std::string& p : {dir_.path(), dir_.Sub("run")}) ASSERT_EQ(chmod(p.c_str(), 0755), 0);
  for (const std::string& p : {socket_, socket_ + ".arena"}) ASSERT_EQ(chmod(p.c_str(), 0666), 0);
  const std::vector<std::string> as_nobody = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                                              "--clear-groups"};
  std::vector<std::string> ctl = as_nobody;
  ctl.insert(ctl.end(),
             {BinPath("kvtierctl"), "--socket", socket_, "--timeout-ms", "2000", "health"});
  const CommandResult health = RunCommand(ctl, 30s);
  if (health.err.find("setpriv") != std::string::npos && !health.ok()) {
    GTEST_SKIP() << "setpriv cannot switch to uid 65534 here: " << health.Describe();
  }
  EXPECT_FALSE(health.ok()) << "uid 65534 reached the gRPC socket\n" << health.Describe();
  std::vector<std::string> client = as_nobody;
  client.insert(client.end(), {BinPath("kvtier_test_client"), "store-load", "--socket", socket_,
                               "--requests", "1"});
  const CommandResult stored = RunCommand(client, 60s);
  EXPECT_FALSE(stored.ok()) << "uid 65534 used the cache\n" << stored.Describe();
  // The arena socket on its own, as a client's first step.
  const CommandResult arena = RunCommand({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                                          "--clear-groups", "/usr/bin/python3", "-c",
                                          "import socket, sys\n"
                                          "s = socket.socket(socket.AF_UNIX)\n"
                                          "s.connect(sys.argv[1])\n"
                                          "print(len(s.recv(64)))\n",
                                          socket_ + ".arena"},
                                         30s);
  EXPECT_EQ(arena.out, "0\n") << "the arena was announced to uid 65534\n" << arena.Describe();
  EXPECT_TRUE(WaitFor(
      [&] {
        const std::string log = ReadFileOrEmpty(dir_.Sub("kvtierd.log"));
        return log.find("gRPC socket: refused a peer: peer pid") != std::string::npos &&
               log.find("arena socket: refused a peer: peer pid") != std::string::npos;
      },
      5s))
      << ReadFileOrEmpty(dir_.Sub("kvtierd.log"));
  EXPECT_NE(ReadFileOrEmpty(dir_.Sub("kvtierd.log")).find("(uid 65534, gid 65534)"),
            std::string::npos);
  EXPECT_TRUE(daemon.Ctl({"health"}).ok()) << "the daemon's own uid is still served";
}

TEST_F(PeerTest, ASocketDirectoryOthersCanWriteIsRefused) {
  const std::string shared = dir_.Sub("shared");
  ASSERT_EQ(mkdir(shared.c_str(), 0777), 0);
  ASSERT_EQ(chmod(shared.c_str(), 01777), 0);  // like /tmp
  const CommandResult r = RunCommand({BinPath("kvtierd"), "--socket", shared + "/kvtierd.sock",
                                      "--dram-bytes", "16MiB", "--nvme-bytes", "0"},
                                     10s);
  EXPECT_EQ(r.exit.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("has mode 01777: other users can write to it"), std::string::npos)
      << r.Describe();
  EXPECT_NE(r.err.find("--socket " + shared + "/kvtier/kvtierd.sock"), std::string::npos)
      << r.Describe();
  EXPECT_FALSE(Exists(shared + "/kvtierd.sock")) << "a refused start left its socket";
  EXPECT_FALSE(Exists(shared + "/kvtierd.sock.lock")) << "a refused start left its lock";
}

// Issue 10, item 11: a session's ids were enough to use it. Session ids are
// sequential, so a second client could release, commit or load through
// another's leases and reservations. Now every call carries its session's
// 128-bit token.
TEST_F(PeerTest, ASecondClientCannotUseAnotherSessionsIds) {
  DaemonProcess daemon(Opts({"--lease-ttl-ms", "600000", "--reservation-ttl-ms", "600000"}));
  ASSERT_EQ(daemon.Start(), "");
  ChildProcess holder;
  const json held = SpawnHolder(holder);
  ASSERT_FALSE(held.is_discarded());
  const uint64_t session = held["session_id"].get<uint64_t>();

  auto stub = v1::KvCache::NewStub(
      grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
  // The intruder's own session, for a token of its own.
  grpc::ClientContext session_ctx;
  auto stream = stub->Session(&session_ctx);
  v1::SessionHello hello;
  hello.set_client_name("intruder");
  v1::SessionOpened mine;
  ASSERT_TRUE(stream->Write(hello) && stream->Read(&mine));
  ASSERT_EQ(mine.session_token().size(), 32u) << "128 bits as hex";
  EXPECT_NE(mine.session_id(), session);

  for (const std::string& token : {std::string(), mine.session_token()}) {
    SCOPED_TRACE(token.empty() ? "no token" : "the intruder's own token");
    const auto call = [&](auto rpc) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 5s);
      if (!token.empty()) ctx.AddMetadata(kSessionTokenKey, token);
      return FromGrpcStatus(rpc(ctx));
    };
    v1::ReleaseReadRequest release;
    release.set_session_id(session);
    release.set_lease_id(held["lease_id"].get<uint64_t>());
    v1::ReleaseReadResponse released;
    Status st =
        call([&](grpc::ClientContext& c) { return stub->ReleaseRead(&c, release, &released); });
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
    v1::CommitWriteRequest commit;
    commit.set_session_id(session);
    commit.set_reservation_id(held["reservation_id"].get<uint64_t>());
    v1::CommitWriteResponse committed;
    st = call([&](grpc::ClientContext& c) { return stub->CommitWrite(&c, commit, &committed); });
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
    v1::LookupRequest lookup;
    lookup.set_session_id(session);
    lookup.set_acquire(true);
    v1::LookupResponse looked;
    st = call([&](grpc::ClientContext& c) { return stub->Lookup(&c, lookup, &looked); });
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
  }
  // Its own session and token, the holder's lease: still not its to release.
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kSessionTokenKey, mine.session_token());
    v1::ReleaseReadRequest release;
    release.set_session_id(mine.session_id());
    release.set_lease_id(held["lease_id"].get<uint64_t>());
    v1::ReleaseReadResponse released;
    EXPECT_EQ(FromGrpcStatus(stub->ReleaseRead(&ctx, release, &released)).code(),
              StatusCode::kPermissionDenied);
  }
  const json s = Stats(daemon);
  EXPECT_EQ(s["active_leases"], 1) << "the holder's lease was released by another client";
  EXPECT_EQ(s["active_reservations"], 1) << "the holder's reservation was committed by another";
  session_ctx.TryCancel();
  holder.Kill();
}

TEST_F(PeerTest, AClientNameOver256BytesIsRefused) {
  DaemonProcess daemon(Opts());
  ASSERT_EQ(daemon.Start(), "");
  auto stub = v1::KvCache::NewStub(
      grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  auto stream = stub->Session(&ctx);
  v1::SessionHello hello;
  hello.set_client_name(std::string(257, 'n'));
  v1::SessionOpened opened;
  ASSERT_TRUE(stream->Write(hello));
  EXPECT_FALSE(stream->Read(&opened)) << "a session was opened";
  const Status st = FromGrpcStatus(stream->Finish());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("client_name is 257 bytes"), std::string::npos) << st.ToString();
  EXPECT_EQ(Stats(daemon)["sessions"], 0);
}

}  // namespace
}  // namespace kvtier::integration
