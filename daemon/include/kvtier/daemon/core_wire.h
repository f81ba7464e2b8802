// CacheCore's calls run with the wire's messages (kvtier.proto): the
// translation between them and the core's own structs (core_calls.h), in one
// place. The gRPC services run these, the control ring runs them for the
// calls it carries as messages, and tests drive the core through them.
#pragma once

#include "kvtier/daemon/cache_core.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::wire {

Status Run(CacheCore& core, const v1::OpenNamespaceRequest& req, v1::OpenNamespaceResponse* resp);
// Completes through `done`, as CacheCore::Lookup; `req` and `resp` must live until then.
void Lookup(CacheCore& core, const v1::LookupRequest& req, v1::LookupResponse* resp,
            CacheCore::Done done);
Status Run(CacheCore& core, const v1::LookupRequest& req, v1::LookupResponse* resp);
Status Run(CacheCore& core, const v1::PrefetchRequest& req, v1::PrefetchResponse* resp);
Status Run(CacheCore& core, const v1::PrefetchStatusRequest& req, v1::PrefetchStatusResponse* resp);
Status Run(CacheCore& core, const v1::ReleaseReadRequest& req);
Status Run(CacheCore& core, const v1::ReserveWriteRequest& req, v1::ReserveWriteResponse* resp);
Status Run(CacheCore& core, const v1::CommitWriteRequest& req, v1::CommitWriteResponse* resp);
Status Run(CacheCore& core, const v1::AbortWriteRequest& req);
Status Run(CacheCore& core, const v1::EvictRequest& req, v1::EvictResponse* resp);
Status Run(CacheCore& core, const v1::ListChunksRequest& req, v1::ListChunksResponse* resp);
void Run(CacheCore& core, v1::StatsResponse* resp);
void Run(CacheCore& core, v1::NamespacesResponse* resp);

// A Lookup's answer in its wire form.
void ToWire(const core::LookupResponse& from, v1::LookupResponse* to);

}  // namespace kvtier::wire
