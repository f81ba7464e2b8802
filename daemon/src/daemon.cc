#include "kvtier/daemon/daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "grpc_services.h"
#include "kvtier/control_ring.h"
#include "kvtier/daemon/metrics.h"
#include "kvtier/fd_passing.h"
#include "kvtier/logging.h"
#include "kvtier/proto/transport_args.h"
#include "kvtier/socket_path.h"
#include "kvtier/units.h"
#include "peer_listener.h"
#include "ring_server.h"

namespace kvtier {
namespace {

uint64_t NewEpoch() {
  std::random_device rd;
  uint64_t e = 0;
  while (e == 0) e = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  return e;
}

std::string ToOctal(unsigned mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0%o", mode);
  return buf;
}

}  // namespace

Result<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  KVTIER_RETURN_IF_ERROR(CheckDramFitsMemory(options.core.dram_bytes, "dram_bytes"));
  // A tier this small holds a few tiny test slots at most: no real model's
  // chunk (llama3-8b fp16 with 256-token chunks: a 32 MiB slot) fits.
  constexpr uint64_t kSmallTierBytes = uint64_t{1} << 20;
  if (options.core.dram_bytes < kSmallTierBytes) {
    spdlog::warn(
        "dram_bytes {} is less than 1 MiB: a namespace whose slot is larger is refused "
        "at open (llama3-8b fp16 with 256-token chunks needs 32 MiB a slot)",
        options.core.dram_bytes);
  }
  if (!options.core.nvme.paths.empty() && options.core.nvme.bytes_per_path < kSmallTierBytes) {
    spdlog::warn(
        "nvme_bytes {} is less than 1 MiB: the NVMe tier holds almost nothing (0 "
        "turns it off)",
        options.core.nvme.bytes_per_path);
  }
  for (const std::string& ignored : options.ignored) spdlog::warn("{}", ignored);
  if (options.core.session_max_bytes > options.core.dram_bytes) {
    spdlog::warn(
        "session_max_bytes {} is more than dram_bytes {}: one session may hold the whole "
        "DRAM arena (0 means half of it)",
        options.core.session_max_bytes, options.core.dram_bytes);
  }
  std::unique_ptr<Daemon> d(new Daemon(options));
  KVTIER_RETURN_IF_ERROR(d->PrepareSocketDir());
  if (options.nvme_default_path) {
    std::error_code ec;
    d->created_nvme_dir_ = std::filesystem::create_directories(options.core.nvme.paths[0], ec);
    if (ec) {
      return Status::InvalidArgument("cannot create the default NVMe directory ./" +
                                     options.core.nvme.paths[0] + ": " + ec.message() +
                                     " (give --nvme-path DIR, or --nvme-bytes 0 for DRAM only)");
    }
  }
  if (options.rebuild_index) {
    auto n = NvmeTier::RebuildIndex(options.core.nvme);
    if (!n.ok()) return n.status();
    spdlog::info("NVMe index rebuilt from slot headers: {} chunks", *n);
  }
  if (options.core.hbm.bytes == 0 &&
      (options.core.hbm.device != 0 || options.core.hbm.backend != HbmBackend::kCuda)) {
    spdlog::warn("--gpu and --gpu-backend only matter with --hbm-bytes; the HBM tier is off");
  }
  // The default NVMe tier's errors say how to size it or turn it off.
  auto open_nvme = [&]() -> Result<std::unique_ptr<NvmeTier>> {
    auto nvme = CacheCore::OpenNvmeTier(options.core);
    if (nvme.ok()) return nvme;
    if (!options.nvme_default_path) {  // name where the paths were given
      return Status(nvme.status().code(),
                    options.Where("nvme_paths") + ": " + nvme.status().message());
    }
    return Status(nvme.status().code(),
                  "NVMe tier (" + FormatBytes(options.core.nvme.bytes_per_path) +
                      " under the default path ./" + options.core.nvme.paths[0] +
                      "): " + nvme.status().message() +
                      " (give --nvme-path DIR and --nvme-bytes SIZE, or --nvme-bytes 0 for "
                      "DRAM only)");
  };
  auto core = CacheCore::Create(options.core, NewEpoch(), SteadyClock::Instance(),
                                CacheCore::NvmeOpener(open_nvme));
  if (!core.ok()) return core.status();
  d->core_ = std::move(core).value();
  KVTIER_RETURN_IF_ERROR(d->StartEvents());
  KVTIER_RETURN_IF_ERROR(d->StartArenaSocket());
  auto ring_fd = ListenUnix(RingSocketPath(options.socket_path), d->SocketMode(), d->SocketGroup());
  if (!ring_fd.ok()) return ring_fd.status();
  d->ring_server_ =
      std::make_unique<RingServer>(*d->core_, *ring_fd, PeerPolicy(geteuid(), d->SocketGroup()));

  d->kv_service_ = std::make_unique<KvCacheService>(*d->core_);
  d->peer_book_ = std::make_unique<PeerBook>();
  // The events endpoints as bound (port 0 becomes the port taken): kvtierctl
  // events and kvtier-replay's router connect to what `config` says.
  DaemonOptions effective = options;
  if (d->events_) {
    effective.events_address = d->events_->address();
    effective.events_replay_address = d->events_->replay_address();
  }
  d->admin_service_ =
      std::make_unique<AdminService>(*d->core_, EffectiveConfig(effective), d->peer_book_.get());
  grpc::ServerBuilder builder;  // no listening port: AcceptLoop hands it checked connections
  builder.RegisterService(d->kv_service_.get());
  builder.RegisterService(d->admin_service_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  for (const auto& [name, value] : TransportArgs()) builder.AddChannelArgument(name, value);
  d->server_ = builder.BuildAndStart();
  if (!d->server_) return Status::Unavailable("the gRPC server did not start");
  auto grpc_fd = ListenUnix(options.socket_path, d->SocketMode(), d->SocketGroup());
  if (!grpc_fd.ok()) return grpc_fd.status();
  d->grpc_listen_fd_ = *grpc_fd;
  KVTIER_RETURN_IF_ERROR(d->StartMetrics());
  d->arena_thread_ = std::thread([p = d.get()] { p->AcceptLoop(); });
  d->sweep_thread_ = std::thread([p = d.get()] { p->SweepLoop(); });
  if (d->core_->nvme_enabled()) d->nvme_thread_ = std::thread([p = d.get()] { p->NvmeLoop(); });
  spdlog::info(
      "kvtierd serving on {} (DRAM arena {} bytes, {} eviction, epoch {:016x}; control "
      "rings on {})",
      options.socket_path, options.core.dram_bytes, EvictionPolicyName(options.core.dram_eviction),
      d->core_->epoch(), RingSocketPath(options.socket_path));
  d->started_ = true;
  return d;
}

Status Daemon::PrepareSocketDir() {
  namespace fs = std::filesystem;
  const fs::path sock(options_.socket_path);
  const fs::path dir = sock.has_parent_path() ? sock.parent_path() : fs::path(".");
  if (!options_.socket_group.empty()) {
    group* g = getgrnam(options_.socket_group.c_str());
    if (g == nullptr) {
      return Status::InvalidArgument(options_.Where("socket_group") + " '" + options_.socket_group +
                                     "' is not a known group");
    }
    socket_gid_ = g->gr_gid;
  }
  const gid_t gid = socket_gid_;
  std::error_code ec;
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  if (!fs::exists(dir, ec) && !fs::is_directory(parent, ec)) {
    return Status::InvalidArgument("socket directory " + dir.string() +
                                   " does not exist, nor does its parent " + parent.string());
  }
  const bool created = fs::create_directory(dir, ec);  // only the last level
  if (ec) return Status::IOError("create socket directory " + dir.string() + ": " + ec.message());
  created_socket_dir_ = created;
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + dir.string());
  if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("socket directory " + dir.string() + " is not a directory");
  }
  // Whoever owns the directory can replace the socket and pose as the daemon.
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    return Status::FailedPrecondition("socket directory " + dir.string() + " belongs to uid " +
                                      std::to_string(st.st_uid) + ", not to this daemon (uid " +
                                      std::to_string(geteuid()) +
                                      "): its owner could replace the socket");
  }
  const mode_t mode = options_.socket_group.empty() ? 0700 : 0750;
  if (created) {  // only a directory we made is ours to restrict
    if (chmod(dir.c_str(), mode) != 0) return Status::FromErrno(errno, "chmod " + dir.string());
    if (gid != static_cast<gid_t>(-1) && chown(dir.c_str(), static_cast<uid_t>(-1), gid) != 0) {
      return Status::FromErrno(errno, "chown " + dir.string());
    }
  } else if ((st.st_mode & 022) != 0) {
    // Others who may create files there could pre-create the lock or the
    // socket paths, or pose as kvtierd once it stops.
    return Status::FailedPrecondition(
        "socket directory " + dir.string() + " has mode " + ToOctal(st.st_mode & 07777) +
        ": other users can write to it and could replace kvtierd's socket; use a directory of "
        "its own (kvtierd creates a missing one with mode 0700, e.g. --socket " +
        (dir / "kvtier" / "kvtierd.sock").string() + ")");
  } else if ((st.st_mode & 0777 & ~mode) != 0) {
    spdlog::warn(
        "socket directory {} has mode {:o}, wider than {:o}; the sockets are {:o} and "
        "every peer's uid is checked",
        dir.string(), st.st_mode & 07777, mode, SocketMode());
  }
  const std::string lock_path = options_.socket_path + ".lock";
  lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) return Status::FromErrno(errno, "open lock file " + lock_path);
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return Status::FailedPrecondition("another kvtierd is serving " + options_.socket_path +
                                        " (it holds " + lock_path + ")");
    }
    return Status::FromErrno(errno, "flock " + lock_path);
  }
  holds_lock_ = true;

  // We hold the lock: socket files left behind are from a dead daemon. Anything
  // else at those paths is not ours to remove.
  for (const std::string& p : {options_.socket_path, ArenaSocketPath(options_.socket_path),
                               RingSocketPath(options_.socket_path)}) {
    struct stat ps {};
    if (lstat(p.c_str(), &ps) != 0) continue;
    if (!S_ISSOCK(ps.st_mode)) {
      return Status::FailedPrecondition(p + " exists and is not a socket; refusing to replace it");
    }
    // A socket someone still listens on belongs to a live program, not to a dead daemon.
    if (UnixSocketListening(p)) {
      return Status::FailedPrecondition("another program is listening on " + p +
                                        "; refusing to replace it");
    }
  }
  owns_socket_ = true;
  unlink(options_.socket_path.c_str());
  unlink(ArenaSocketPath(options_.socket_path).c_str());
  unlink(RingSocketPath(options_.socket_path).c_str());
  return Status::Ok();
}

mode_t Daemon::SocketMode() const { return options_.socket_group.empty() ? 0600 : 0660; }

std::optional<gid_t> Daemon::SocketGroup() const {
  if (options_.socket_group.empty()) return std::nullopt;
  return socket_gid_;
}

Status Daemon::StartArenaSocket() {
  auto fd = ListenUnix(ArenaSocketPath(options_.socket_path), SocketMode(), SocketGroup());
  if (!fd.ok()) return fd.status();
  arena_listen_fd_ = *fd;
  return Status::Ok();
}

void Daemon::AcceptLoop() {
  ArenaAnnouncement msg;
  msg.epoch = core_->epoch();
  msg.arena_bytes = core_->arena().bytes();
  const PeerPolicy peers(geteuid(), SocketGroup());
  LogLimiter refusals[2];  // arena, gRPC
  LogLimiter send_failures;
  while (!stopping_.load()) {
    pollfd pfds[2] = {{arena_listen_fd_, POLLIN, 0}, {grpc_listen_fd_, POLLIN, 0}};
    if (poll(pfds, 2, 100) <= 0) continue;
    const bool arena = (pfds[0].revents & POLLIN) != 0;
    const int listen_fd = arena ? arena_listen_fd_ : grpc_listen_fd_;
    int conn = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | (arena ? 0 : SOCK_NONBLOCK));
    if (conn < 0) {
      const int err = errno;
      if (err == EINTR || err == EAGAIN || err == ECONNABORTED) continue;
      // Out of file descriptors (EMFILE, ENFILE) or memory: the connection
      // waits in the backlog and poll says so again at once. Say it once a
      // run of failures, and back off instead of spinning.
      if (!accept_failing_) {
        spdlog::error(
            "{} socket: accept failed: {}; clients cannot connect until it succeeds "
            "(raise the open-files limit?)",
            arena ? "arena" : "gRPC", std::strerror(err));
        accept_failing_ = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (accept_failing_) {
      spdlog::info("{} socket: accept succeeds again", arena ? "arena" : "gRPC");
      accept_failing_ = false;
    }
    if (Status allowed = peers.Check(conn); !allowed.ok()) {
      if (auto held_back = refusals[arena ? 0 : 1].Admit()) {
        spdlog::warn("{} socket: refused a peer: {}{}", arena ? "arena" : "gRPC", allowed.message(),
                     HeldBack(*held_back));
      }
      close(conn);
      continue;
    }
    if (!arena) {
      peer_book_->Record(conn);                             // before gRPC may read a call from it
      grpc::AddInsecureChannelFromFd(server_.get(), conn);  // gRPC owns it now
      continue;
    }
    Status st = SendArenaFd(conn, msg, core_->arena().fd());
    if (!st.ok()) {
      if (auto held_back = send_failures.Admit()) {
        spdlog::warn("arena socket: {}{}", st.ToString(), HeldBack(*held_back));
      }
    }
    close(conn);
  }
}

void Daemon::SweepLoop() {
  using namespace std::chrono_literals;
  auto next_persist = std::chrono::steady_clock::now() + 1s;
  while (!stopping_.load()) {
    std::this_thread::sleep_for(50ms);
    core_->ExpireNow();
    if (std::chrono::steady_clock::now() >= next_persist) {
      core_->PersistNvmeAccessTimes();
      next_persist = std::chrono::steady_clock::now() + 1s;
    }
  }
}

void Daemon::NvmeLoop() {
  using namespace std::chrono_literals;
  // Up to 4 batches a call (256 MiB at most), each written beside the next one's copy;
  // stopping_ is looked at before each batch is taken. An exception (none is expected: the
  // writer counts a batch it has no memory for as lost) is logged, not the end of kvtierd.
  const auto keep_going = [this] { return !stopping_.load(); };
  while (!stopping_.load()) {
    size_t taken = 0;
    try {
      taken = core_->DestageBatches(4, keep_going);
    } catch (const std::exception& e) {
      spdlog::error("NVMe writer: {}", e.what());
    }
    if (taken == 0) std::this_thread::sleep_for(5ms);
  }
}

size_t Daemon::DrainNvme(const std::atomic<bool>* abort) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto until = start + options_.drain_timeout;
  auto next_report = start + std::chrono::seconds(1);
  auto keep_going = [&] {
    const auto now = Clock::now();
    if (now >= next_report && now < until) {
      spdlog::info("shutdown: {} NVMe writes pending after {} ms (at most {} ms more)",
                   core_->PendingNvmeWrites(),
                   std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count(),
                   std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count());
      next_report = now + std::chrono::seconds(1);
    }
    return now < until && (abort == nullptr || !abort->load());
  };
  // What was committed reaches NVMe first; then write-back's DRAM-only chunks.
  while (keep_going() && core_->DestageOnce() > 0) {
  }
  if (const size_t n = core_->FlushWriteBack(keep_going); n > 0) {
    spdlog::info("write-back: queued {} DRAM-only chunks for NVMe at shutdown", n);
  }
  const size_t left = core_->PendingNvmeWrites() + core_->WriteBackDramOnly();
  if (left == 0) return 0;
  const bool aborted = abort != nullptr && abort->load();
  const bool timed_out = !aborted && Clock::now() >= until;
  const char* why = aborted     ? "a second signal stopped the drain"
                    : timed_out ? "--drain-timeout-ms ran out"
                                : "the NVMe tier did not take them (no room, their parent gone "
                                  "from NVMe, or degraded)";
  spdlog::warn("shutdown: after {} ms, {} chunks were not written to NVMe and are lost ({})",
               std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count(),
               left, why);
  return aborted || timed_out ? left : 0;
}

size_t Daemon::Shutdown(const std::atomic<bool>* abort) {
  if (shut_down_) return 0;
  shut_down_ = true;
  stopping_.store(true);
  metrics_.reset();                                    // before core_ goes: it reads its stats
  if (arena_thread_.joinable()) arena_thread_.join();  // hands gRPC no connection after this
  if (ring_server_) ring_server_->Stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  if (sweep_thread_.joinable()) sweep_thread_.join();
  if (nvme_thread_.joinable()) nvme_thread_.join();
  const size_t cut_short = core_ && core_->nvme_enabled() ? DrainNvme(abort) : 0;
  if (arena_listen_fd_ >= 0) close(arena_listen_fd_);
  if (grpc_listen_fd_ >= 0) close(grpc_listen_fd_);
  if (owns_socket_) {  // a daemon refused by the lock must not remove the server's sockets
    unlink(options_.socket_path.c_str());
    unlink(ArenaSocketPath(options_.socket_path).c_str());
    unlink(RingSocketPath(options_.socket_path).c_str());
  }
  if (!started_) {
    // A refused start leaves nothing behind: its lock file (unlinked while we
    // still hold the lock), and the default NVMe directory and the socket
    // directory it made, if empty.
    if (holds_lock_) unlink((options_.socket_path + ".lock").c_str());
    std::error_code ec;
    if (created_nvme_dir_) std::filesystem::remove(options_.core.nvme.paths[0], ec);
    if (created_socket_dir_) {
      std::filesystem::remove(std::filesystem::path(options_.socket_path).parent_path(), ec);
    }
  }
  if (lock_fd_ >= 0) close(lock_fd_);
  arena_listen_fd_ = grpc_listen_fd_ = lock_fd_ = -1;
  return cut_short;
}

Status Daemon::StartMetrics() {
  auto address = ParseMetricsAddress(options_.metrics_address);  // checked when parsed
  if (!address.ok()) return address.status();
  if (address->off()) return Status::Ok();
  auto m = MetricsServer::Start(*address, [core = core_.get(), events = events_.get()] {
    return PrometheusText(core->Stats(), core->ReadLatencies()) + KvEventMetricsText(events);
  });
  if (!m.ok()) {
    if (!options_.metrics_default) {
      return Status(m.status().code(), options_.Where("metrics_address") + " " +
                                           options_.metrics_address + ": " + m.status().message());
    }
    // The default address, taken (a second kvtierd on this machine): serve without it.
    spdlog::warn("metrics off: {} (give each kvtierd its own --metrics-address, or off)",
                 m.status().message());
    return Status::Ok();
  }
  metrics_ = std::move(m).value();
  spdlog::info("Prometheus metrics on http://{}:{}/metrics", address->host, metrics_->port());
  return Status::Ok();
}

Status Daemon::StartEvents() {
  if (options_.events_address.empty()) return Status::Ok();
  KvEventPublisherOptions events;
  events.address = options_.events_address;
  events.replay_address = options_.events_replay_address;
  auto p = KvEventPublisher::Create(events);
  if (!p.ok()) {
    const bool replay =
        !options_.events_replay_address.empty() &&
        p.status().message().rfind("cannot bind " + options_.events_replay_address + ":", 0) == 0;
    return Status(p.status().code(),
                  options_.Where(replay ? "events_replay_address" : "events_address") + ": " +
                      p.status().message());
  }
  events_ = std::move(p).value();
  core_->SetKvEventSink(events_.get());
  spdlog::info(
      "KV events on {}{}", events_->address(),
      events_->replay_address().empty() ? "" : " (replay on " + events_->replay_address() + ")");
  return Status::Ok();
}

int Daemon::metrics_port() const { return metrics_ ? metrics_->port() : 0; }

Daemon::Daemon(const DaemonOptions& options) : options_(options) {}

Daemon::~Daemon() { Shutdown(); }

}  // namespace kvtier
