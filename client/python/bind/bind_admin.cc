// kvtier.AdminClient: the operator's view (what kvtierctl prints), as plain dicts. Unlike
// Client it does not fail open: an unreachable daemon raises Unavailable or DeadlineExceeded.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <chrono>

#include "bindings.h"
#include "convert.h"
#include "kvtier/admin_client.h"
#include "kvtier/socket_path.h"

namespace kvtier::python {
namespace {

nb::dict TierDict(const TierStats& t) {
  nb::dict d;
  d["name"] = t.name;
  d["capacity_bytes"] = t.capacity_bytes;
  d["used_bytes"] = t.used_bytes;
  d["capacity_chunks"] = t.capacity_chunks;
  d["chunks"] = t.chunks;
  d["hits"] = t.hits;
  d["misses"] = t.misses;
  d["evictions"] = t.evictions;
  d["read_bytes"] = t.read_bytes;
  d["write_bytes"] = t.write_bytes;
  d["pending_writes"] = t.pending_writes;
  d["corrupt_reads"] = t.corrupt_reads;
  d["io_errors"] = t.io_errors;
  d["degraded"] = t.degraded;
  d["skipped_writes"] = t.skipped_writes;
  d["lost_writes"] = t.lost_writes;
  d["throttled_writes"] = t.throttled_writes;
  d["pinned_chunks"] = t.pinned_chunks;
  d["uncommitted_bytes"] = t.uncommitted_bytes;
  d["unserved_hits"] = t.unserved_hits;
  d["unserved_read_bytes"] = t.unserved_read_bytes;
  return d;
}

nb::dict TierTokensDict(const TierTokens& t) {
  nb::dict d;
  d["hbm"] = t.hbm;
  d["dram"] = t.dram;
  d["nvme"] = t.nvme;
  d["remote"] = t.remote;
  return d;
}

nb::dict StatsDict(const DaemonStats& s) {
  nb::dict d;
  nb::list tiers;
  for (const TierStats& t : s.tiers) tiers.append(TierDict(t));
  d["tiers"] = tiers;
  d["lookups"] = s.lookups;
  d["ring_lookups"] = s.ring_lookups;
  d["ring_calls"] = s.ring_calls;
  d["lookup_tokens"] = s.lookup_tokens;
  d["hit_tokens"] = s.hit_tokens;
  d["sessions"] = s.sessions;
  d["active_leases"] = s.active_leases;
  d["active_reservations"] = s.active_reservations;
  d["uptime_s"] = s.uptime_s;
  d["active_prefetches"] = s.active_prefetches;
  d["prefetched_chunks"] = s.prefetched_chunks;
  d["session_limited"] = s.session_limited;
  d["lookup_chunks"] = s.lookup_chunks;
  d["unserved_hit_tokens"] = s.unserved_hit_tokens;
  nb::list models;
  for (const ModelStats& m : s.models) {
    nb::dict md;
    md["model_id"] = m.model_id;
    md["lookup_tokens"] = m.lookup_tokens;
    md["hit_tokens"] = TierTokensDict(m.hit_tokens);
    md["unserved_hit_tokens"] = TierTokensDict(m.unserved_hit_tokens);
    models.append(md);
  }
  d["models"] = models;
  nb::dict p;
  p["nothing_cached"] = s.prefetches.nothing_cached;
  p["over_budget"] = s.prefetches.over_budget;
  p["used"] = s.prefetches.used;
  p["used_early"] = s.prefetches.used_early;
  p["expired"] = s.prefetches.expired;
  p["session_ended"] = s.prefetches.session_ended;
  d["prefetches"] = p;
  return d;
}

}  // namespace

void BindAdmin(nb::module_& m) {
  nb::class_<AdminClient>(m, "AdminClient",
                          "The operator's view of a kvtierd (what kvtierctl prints). Does not "
                          "fail open. Thread-safe.")
      .def_static(
          "connect",
          [](const std::string& socket, int64_t deadline_ms) {
            nb::gil_scoped_release release;
            return ValueOrThrow(AdminClient::Connect(socket.empty() ? DefaultSocketPath() : socket,
                                                     std::chrono::milliseconds(deadline_ms)));
          },
          nb::arg("socket") = "", nb::arg("deadline_ms") = 1000,
          "Opens a channel to kvtierd's socket ('' = ${XDG_RUNTIME_DIR:-/tmp}/kvtier/"
          "kvtierd.sock, as Client.connect) with no RPC yet; deadline_ms bounds each call.\n\n"
          "Raises InvalidArgument for an empty path or a nonpositive deadline.")
      .def(
          "stats",
          [](AdminClient& a) {
            DaemonStats s;
            {
              nb::gil_scoped_release release;
              s = ValueOrThrow(a.Stats());
            }
            return StatsDict(s);
          },
          nb::sig("def stats(self) -> dict[str, typing.Any]"),
          "The daemon's counters as a dict: 'tiers' (a list of dicts with name, "
          "capacity_bytes, used_bytes, capacity_chunks, chunks, hits, misses, evictions, "
          "read_bytes, "
          "write_bytes, pending_writes, corrupt_reads, io_errors, degraded, skipped_writes, "
          "lost_writes, throttled_writes, "
          "pinned_chunks, uncommitted_bytes, unserved_hits, unserved_read_bytes; hits and "
          "read_bytes count what was served, the unserved ones leases whose Lookup answer "
          "never reached the client), "
          "lookups, ring_lookups (of lookups, those over a control ring), ring_calls (calls "
          "of every kind over a control ring; both running totals), lookup_tokens, hit_tokens, "
          "sessions, active_leases, active_reservations, "
          "uptime_s, active_prefetches, prefetched_chunks, session_limited, lookup_chunks, "
          "unserved_hit_tokens, models (a list of dicts: model_id, lookup_tokens, hit_tokens "
          "and unserved_hit_tokens as dicts of hbm, dram, nvme, remote), prefetches (a dict of "
          "outcome -> count: nothing_cached, over_budget, used, used_early, expired, "
          "session_ended).\n\n"
          "Raises Unavailable or DeadlineExceeded when the daemon does not answer.")
      .def(
          "health",
          [](AdminClient& a) {
            DaemonHealth h;
            {
              nb::gil_scoped_release release;
              h = ValueOrThrow(a.Health());
            }
            nb::dict d;
            d["serving"] = h.serving;
            d["version"] = h.version;
            d["epoch"] = h.epoch;
            d["pid"] = h.pid;
            nb::list degraded;
            for (const std::string& t : h.degraded_tiers) degraded.append(t);
            d["degraded_tiers"] = degraded;
            return d;
          },
          nb::sig("def health(self) -> dict[str, typing.Any]"),
          "{'serving', 'version', 'epoch' (changes on every start), 'pid', 'degraded_tiers'}.\n\n"
          "Raises Unavailable or DeadlineExceeded when the daemon does not answer.")
      .def(
          "namespaces",
          [](AdminClient& a) {
            std::vector<NamespaceInfo> infos;
            {
              nb::gil_scoped_release release;
              infos = ValueOrThrow(a.Namespaces());
            }
            nb::list out;
            for (const NamespaceInfo& i : infos) {
              nb::dict d;
              d["id"] = i.id.ToHex();
              d["spec"] = i.spec.RedactedString();
              d["model_id"] = i.spec.model_id;
              d["chunks"] = i.chunks;
              d["slot_bytes"] = i.slot_bytes;
              out.append(d);
            }
            return out;
          },
          nb::sig("def namespaces(self) -> list[dict[str, typing.Any]]"),
          "Namespaces the daemon knows: dicts with id, spec (canonical string), model_id, "
          "chunks (resident in DRAM), slot_bytes.\n\n"
          "Raises Unavailable or DeadlineExceeded when the daemon does not answer.")
      .def(
          "evict",
          [](AdminClient& a, bool all, std::optional<std::string> ns, nb::handle tokens) {
            // The scope rules in this API's names (kvtierd's messages name the wire's fields).
            if (all == ns.has_value()) {
              ThrowIfError(Status::InvalidArgument(
                  "give exactly one scope: all=True, or namespace (with tokens for a prompt "
                  "prefix)"));
            }
            if (all && !tokens.is_none()) {
              ThrowIfError(Status::InvalidArgument(
                  "tokens name a prompt prefix of namespace; all=True takes none"));
            }
            EvictScope scope;
            scope.all = all;
            if (ns) {
              scope.ns = ChunkKey::FromHex(*ns);
              if (!scope.ns) {
                ThrowIfError(Status::InvalidArgument("namespace '" + *ns +
                                                     "' is not a namespace id (32 hex digits, as "
                                                     "Namespace.id and namespaces() give)"));
              }
            }
            if (!tokens.is_none()) scope.tokens = TokensFrom(tokens);  // empty: refused
            std::vector<TierEviction> tiers;
            {
              nb::gil_scoped_release release;
              tiers = ValueOrThrow(a.Evict(scope));
            }
            nb::dict out;
            for (const TierEviction& t : tiers) {
              nb::dict d;
              d["removed"] = t.removed;
              d["kept"] = t.kept;
              out[t.tier.c_str()] = d;
            }
            return out;
          },
          nb::kw_only(), nb::arg("all") = false, nb::arg("namespace") = nb::none(),
          nb::arg("tokens") = nb::none(),
          nb::sig("def evict(self, *, all: bool = False, namespace: str | None = None, "
                  "tokens: object | None = None) -> dict[str, dict[str, int]]"),
          "Drops cached chunks from every tier now; the daemon logs the eviction. Exactly one "
          "scope: all=True; namespace (its id, 32 hex digits); or namespace with tokens (a "
          "list, int32/int64 array or tensor of token ids; for an engine-keyed namespace, "
          "chunk ids): the chunk holding the last full chunk of those tokens and every chunk "
          "after it, that is every cached prompt that begins with them.\n\n"
          "Returns {tier: {'removed': chunks dropped, 'kept': chunks kept because a lease, "
          "a read or a copy pins them or one after them}} for 'hbm', 'dram' and 'nvme' (the "
          "tiers that are on).\n\n"
          "Raises InvalidArgument for no scope or two, tokens with all, a malformed id, or "
          "tokens empty or shorter than one chunk; NotFound for tokens of a namespace not "
          "open in the daemon; Internal when the NVMe index refused, e.g. on a full disk "
          "(nothing was evicted); Unavailable or "
          "DeadlineExceeded when the daemon does not answer.");
}

}  // namespace kvtier::python
