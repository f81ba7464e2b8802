#include "daemon_socket.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "kvtier/fd_passing.h"

namespace kvtier::client_internal {

Result<std::shared_ptr<DaemonSocket>> DaemonSocket::Connect(const std::string& path,
                                                            Clock::time_point deadline,
                                                            int* grpc_fd) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  auto connected = ConnectUnixSocket(path, static_cast<int>(std::max<int64_t>(left.count(), 1)));
  if (!connected.ok()) return connected.status();
  const int fd = *connected;
  std::shared_ptr<DaemonSocket> sock(new DaemonSocket(fd));
  const int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return Status::Unavailable(std::string("dup: ") + std::strerror(errno));
  // O_NONBLOCK belongs to the open file, which both descriptors share; gRPC needs it.
  if (const int flags = fcntl(dup_fd, F_GETFL);
      flags < 0 || fcntl(dup_fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    const int err = errno;
    close(dup_fd);
    return Status::Unavailable(std::string("fcntl O_NONBLOCK: ") + std::strerror(err));
  }
  *grpc_fd = dup_fd;
  return sock;
}

DaemonSocket::~DaemonSocket() { close(fd_); }

void DaemonSocket::Shutdown() { shutdown(fd_, SHUT_RDWR); }

CallWatchdog& CallWatchdog::Instance() {
  static CallWatchdog* const watchdog = new CallWatchdog;  // never destroyed: its thread runs on
  return *watchdog;
}

CallWatchdog::Watch::Watch(std::shared_ptr<DaemonSocket> socket, Clock::time_point deadline)
    : id_(socket ? Instance().Add(std::move(socket), deadline) : 0) {}

CallWatchdog::Watch::~Watch() {
  if (id_ != 0) Instance().Remove(id_);
}

uint64_t CallWatchdog::Add(std::shared_ptr<DaemonSocket> socket, Clock::time_point deadline) {
  std::lock_guard lock(mu_);
  if (!started_) {
    std::thread([this] { Loop(); }).detach();
    started_ = true;
  }
  const uint64_t id = next_id_++;
  const auto due = deadline + kGrace;
  calls_.emplace(id, Entry{std::move(socket), due});
  if (due < wake_at_) cv_.notify_one();  // most calls are due after what Loop waits for
  return id;
}

void CallWatchdog::Remove(uint64_t id) {
  std::shared_ptr<DaemonSocket> last;  // freed outside mu_
  std::lock_guard lock(mu_);
  if (auto it = calls_.find(id); it != calls_.end()) {
    last = std::move(it->second.socket);
    calls_.erase(it);
  }
}

void CallWatchdog::Loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    auto earliest = Clock::time_point::max();
    for (const auto& [id, e] : calls_) earliest = std::min(earliest, e.due);
    if (Clock::now() < earliest) {
      wake_at_ = earliest;
      if (earliest == Clock::time_point::max()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, earliest);
      }
      wake_at_ = Clock::time_point::min();
      continue;
    }
    std::vector<std::shared_ptr<DaemonSocket>> overdue;
    const auto now = Clock::now();
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (it->second.due <= now) {
        overdue.push_back(std::move(it->second.socket));
        it = calls_.erase(it);
      } else {
        ++it;
      }
    }
    lock.unlock();
    spdlog::warn(
        "kvtier client: {} call(s) ran {} ms past their deadline (kvtierd not reading?); "
        "closing their connection",
        overdue.size(), kGrace.count());
    for (auto& s : overdue) s->Shutdown();
    overdue.clear();
    lock.lock();
  }
}

}  // namespace kvtier::client_internal
