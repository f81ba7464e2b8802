#include "kvtier/control_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <new>

#include "kvtier/fd_passing.h"

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449  // the same number on every architecture (Linux 5.16)
#endif

namespace kvtier {

Result<uint8_t*> RingMemory::MapShared(int fd) {
  void* base = mmap(nullptr, kRingBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base != MAP_FAILED) return static_cast<uint8_t*>(base);
  const int err = errno;
  close(fd);
  return Status::FromErrno(err, "mmap control ring");
}

Result<RingMemory> RingMemory::Create(uint64_t session_id) {
  const int fd = memfd_create("kvtier-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::FromErrno(errno, "memfd_create control ring");
  // Sealed against resizing: a client that shrank it would make kvtierd's
  // next touch of a page past the end a SIGBUS.
  if (ftruncate(fd, static_cast<off_t>(kRingBytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    close(fd);
    return Status::FromErrno(err, "sizing and sealing the control ring");
  }
  auto mapped = MapShared(fd);
  if (!mapped.ok()) return mapped.status();
  RingMemory ring(*mapped, fd);
  new (ring.base_) RingHeader();
  ring.header().session_id = session_id;
  for (uint32_t i = 0; i < kRingDepth; ++i) new (&ring.slot(i)) RingSlot();
  return ring;
}

Result<RingMemory> RingMemory::Map(int fd, uint64_t session_id) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return Status::FromErrno(err, "fstat control ring");
  }
  if (static_cast<uint64_t>(st.st_size) != kRingBytes) {
    close(fd);
    return Status::DataLoss("control ring is " + std::to_string(st.st_size) + " bytes, not " +
                            std::to_string(kRingBytes));
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    close(fd);
    return Status::DataLoss("control ring is not sealed against resizing");
  }
  auto mapped = MapShared(fd);
  if (!mapped.ok()) return mapped.status();
  RingMemory ring(*mapped, fd);
  const RingHeader& h = ring.header();
  if (h.magic != kRingMagic || h.version != kRingVersion || h.depth != kRingDepth ||
      h.slot_data_bytes != kRingSlotDataBytes) {
    return Status::DataLoss("control ring header: magic, version " + std::to_string(h.version) +
                            " or depth " + std::to_string(h.depth) + " differ from this SDK's");
  }
  if (h.session_id != session_id) {
    return Status::DataLoss("control ring belongs to session " + std::to_string(h.session_id) +
                            ", not " + std::to_string(session_id));
  }
  return ring;
}

RingMemory::RingMemory(RingMemory&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), fd_(std::exchange(other.fd_, -1)) {}

RingMemory& RingMemory::operator=(RingMemory&& other) noexcept {
  if (this != &other) {
    this->~RingMemory();
    base_ = std::exchange(other.base_, nullptr);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

RingMemory::~RingMemory() {
  if (base_ != nullptr) munmap(base_, kRingBytes);
  if (fd_ >= 0) close(fd_);
}

Result<RingCall> DecodeSubmission(const RingSubmission& entry, std::span<const uint8_t> data) {
  if (entry.op < static_cast<uint32_t>(RingOp::kLookup) ||
      entry.op > static_cast<uint32_t>(RingOp::kPrefetchStatus)) {
    return Status::InvalidArgument("ring entry op " + std::to_string(entry.op) +
                                   " is none of Lookup (1) to PrefetchStatus (6)");
  }
  const auto op = static_cast<RingOp>(entry.op);
  if (op != RingOp::kLookup) {
    if (entry.flags != 0 || entry.token_count != 0 || entry.request_id_bytes != 0 ||
        entry.first_chunk != 0) {
      return Status::InvalidArgument("ring entry op " + std::to_string(entry.op) +
                                     " takes no flags, tokens, request id or first chunk");
    }
    if (op == RingOp::kReleaseRead ? entry.message_bytes != 0 : entry.message_bytes > data.size()) {
      return Status::InvalidArgument("ring entry op " + std::to_string(entry.op) + ": message of " +
                                     std::to_string(entry.message_bytes) +
                                     " bytes (the slot holds " + std::to_string(data.size()) + ")");
    }
    RingCall call;
    call.op = op;
    call.seq = entry.seq;
    call.lease_id = entry.lease_id;
    call.message.assign(reinterpret_cast<const char*>(data.data()), entry.message_bytes);
    return call;
  }
  if (entry.message_bytes != 0) {
    return Status::InvalidArgument("ring entry: a Lookup carries no message");
  }
  if ((entry.flags & ~kRingKnownFlags) != 0) {
    return Status::InvalidArgument("ring entry flags " + std::to_string(entry.flags) +
                                   " has unknown bits (known: acquire 1, hbm 2, adopt_ticket 4)");
  }
  if (entry.request_id_bytes > kRingMaxRequestIdBytes) {
    return Status::InvalidArgument("ring entry request id is " +
                                   std::to_string(entry.request_id_bytes) + " bytes, more than " +
                                   std::to_string(kRingMaxRequestIdBytes));
  }
  if (uint64_t{entry.token_count} * sizeof(int32_t) + entry.request_id_bytes > data.size()) {
    return Status::InvalidArgument("ring entry holds " + std::to_string(entry.token_count) +
                                   " tokens and a " + std::to_string(entry.request_id_bytes) +
                                   "-byte request id: more than the slot's " +
                                   std::to_string(data.size()) + " bytes");
  }
  RingCall call;
  call.seq = entry.seq;
  call.acquire = (entry.flags & kRingAcquire) != 0;
  call.hbm = (entry.flags & kRingHbm) != 0;
  call.adopt_ticket = (entry.flags & kRingAdoptTicket) != 0;
  call.max_chunks = entry.max_chunks;
  if (call.acquire && (call.max_chunks == 0 || call.max_chunks > kRingMaxLocations)) {
    call.max_chunks = kRingMaxLocations;  // the locations must fit in the data area
  }
  call.prefetch_ticket = entry.prefetch_ticket;
  call.first_chunk = entry.first_chunk;
  call.namespace_id.assign(reinterpret_cast<const char*>(entry.namespace_id),
                           sizeof(entry.namespace_id));
  const size_t token_bytes = size_t{entry.token_count} * sizeof(int32_t);
  call.tokens.assign(reinterpret_cast<const char*>(data.data()), token_bytes);
  call.request_id.assign(reinterpret_cast<const char*>(data.data()) + token_bytes,
                         entry.request_id_bytes);
  return call;
}

void RingFutexWait(std::atomic<uint32_t>& word, uint32_t expected,
                   std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000),
              static_cast<long>(timeout.count() % 1'000'000'000)};
  // Not FUTEX_PRIVATE_FLAG: the word lives in memory shared with another process.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void RingFutexWake(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void RingFutexWaitAny(std::span<std::atomic<uint32_t>* const> words,
                      std::span<const uint32_t> expected, std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0 || words.empty()) return;
  futex_waitv waiters[kRingWaitAnyMax] = {};
  const size_t n = std::min({words.size(), expected.size(), kRingWaitAnyMax});
  for (size_t i = 0; i < n; ++i) {
    waiters[i].val = expected[i];
    waiters[i].uaddr = reinterpret_cast<uintptr_t>(words[i]);
    waiters[i].flags = FUTEX_32;  // shared: the words live in memory shared with clients
  }
  timespec until;  // futex_waitv takes an absolute time
  clock_gettime(CLOCK_MONOTONIC, &until);
  const auto ns = until.tv_nsec + timeout.count();
  until.tv_sec += static_cast<time_t>(ns / 1'000'000'000);
  until.tv_nsec = static_cast<long>(ns % 1'000'000'000);
  if (syscall(SYS_futex_waitv, waiters, static_cast<unsigned>(n), 0, &until, CLOCK_MONOTONIC) < 0 &&
      errno == ENOSYS) {
    const auto nap = std::min<std::chrono::nanoseconds>(timeout, std::chrono::microseconds(200));
    timespec ts{0, static_cast<long>(nap.count())};
    nanosleep(&ts, nullptr);
  }
}

std::string RingSocketPath(const std::string& socket_path) { return socket_path + ".ring"; }

bool RingComplete(RingSlot& slot, uint32_t seq) {
  uint32_t pending = 0;
  const bool wanted = slot.done.compare_exchange_strong(pending, seq, std::memory_order_acq_rel);
  if (!wanted) slot.done.store(seq, std::memory_order_release);  // the client sweeps it free
  RingFutexWake(slot.done);
  return wanted;
}

bool RingGiveUp(RingSlot& slot) {
  uint32_t pending = 0;
  return slot.done.compare_exchange_strong(pending, kRingGivenUp, std::memory_order_acq_rel);
}

Result<int> RequestRingFd(const std::string& socket_path, uint64_t session_id,
                          std::string_view session_token, int timeout_ms) {
  const std::string path = RingSocketPath(socket_path);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto connected = ConnectUnixSocket(path, timeout_ms);
  if (!connected.ok()) return connected.status();
  const int sock = *connected;
  if (Status st = CheckDaemonPeer(sock, path); !st.ok()) {  // the token goes to kvtierd only
    close(sock);
    return st;
  }
  RingHello hello;
  hello.session_id = session_id;
  std::memcpy(hello.session_token, session_token.data(),
              std::min(session_token.size(), sizeof(hello.session_token)));
  if (send(sock, &hello, sizeof(hello), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(hello))) {
    const int err = errno;
    close(sock);
    return Status::Unavailable("send to " + path + ": " + std::strerror(err));
  }
  RingAnnouncement msg;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      until - std::chrono::steady_clock::now());  // one budget for connect and answer
  auto received = ReceiveFd(sock, static_cast<int>(std::max<int64_t>(left.count(), 1)), &msg,
                            sizeof(msg), path);
  close(sock);
  if (!received.ok()) return received.status();
  const int fd = *received;
  if (msg.magic != kRingMagic) {
    if (fd >= 0) close(fd);
    return Status::DataLoss("malformed answer from " + path);
  }
  if (msg.code != 0) {
    if (fd >= 0) close(fd);
    if (!RingStatusCodeKnown(msg.code)) {
      return Status::DataLoss("unknown status code " + std::to_string(msg.code) + " from " + path);
    }
    msg.message[sizeof(msg.message) - 1] = '\0';
    return Status(static_cast<StatusCode>(msg.code), std::string(path) + ": " + msg.message);
  }
  if (fd < 0) return Status::DataLoss("no ring fd from " + path);
  return fd;
}

}  // namespace kvtier
