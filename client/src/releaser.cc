// Lease releases and reservation aborts sent without waiting (releaser.h).
#include "releaser.h"

#include <utility>

#include "ring_client.h"

namespace kvtier::client_internal {

template <typename Response, typename Request, typename Start>
void Releaser::Send(std::shared_ptr<Connection> conn, Request req,
                    std::chrono::milliseconds deadline, Start start) {
  auto owned = std::make_shared<Call<Request, Response>>();
  auto* call = owned.get();
  call->conn = std::move(conn);
  call->req = std::move(req);
  call->ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;  // the session's end ends it
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    in_flight_.emplace(call, std::move(owned));
  }
  start(call->conn->stub->async(), &call->ctx, &call->req, &call->resp,
        std::function<void(grpc::Status)>([this, call](grpc::Status) { Finished(call); }));
}

void Releaser::Finished(CallBase* call) {
  std::lock_guard lock(mu_);
  auto it = in_flight_.find(call);
  finished_.push_back(std::move(it->second));
  in_flight_.erase(it);
  cv_.notify_one();
}

void Releaser::Release(std::shared_ptr<Connection> conn, uint64_t lease_id,
                       std::chrono::milliseconds deadline) {
  // On the control ring, behind this thread's Lookups and ahead of its next.
  if (conn->ring && conn->alive() && conn->ring->ReleaseRead(lease_id)) return;
  v1::ReleaseReadRequest req;
  req.set_session_id(conn->session_id);
  req.set_lease_id(lease_id);
  // A failed release is not the engine's problem: the session or TTL ends the lease.
  Send<v1::ReleaseReadResponse>(std::move(conn), std::move(req), deadline,
                                [](auto* async, auto... args) { async->ReleaseRead(args...); });
}

void Releaser::Abort(std::shared_ptr<Connection> conn, uint64_t reservation_id,
                     std::chrono::milliseconds deadline) {
  v1::AbortWriteRequest req;
  req.set_session_id(conn->session_id);
  req.set_reservation_id(reservation_id);
  Send<v1::AbortWriteResponse>(std::move(conn), std::move(req), deadline,
                               [](auto* async, auto... args) { async->AbortWrite(args...); });
}

void Releaser::Stop(bool drop_pending) {
  std::vector<std::shared_ptr<CallBase>> cancel;
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
    if (drop_pending) {
      for (auto& entry : in_flight_) cancel.push_back(entry.second);
    }
  }
  // Outside mu_: a cancelled call's callback may run on this thread, in TryCancel.
  for (auto& call : cancel) call->ctx.TryCancel();
  cancel.clear();
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Releaser::Loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !finished_.empty() || (stopped_ && in_flight_.empty()); });
    std::vector<std::shared_ptr<CallBase>> done;
    done.swap(finished_);
    const bool last = stopped_ && in_flight_.empty();
    lock.unlock();
    done.clear();  // the connections' last references may go here, on this thread
    lock.lock();
    if (last && finished_.empty()) return;
  }
}

}  // namespace kvtier::client_internal
