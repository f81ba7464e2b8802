// What kvtier.Client returns: namespaces, results, tickets, leases and reservations
// (client/include/kvtier/client.h holds the contract; the docstrings repeat what a Python
// caller needs).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstring>

#include "bindings.h"
#include "convert.h"
#include "kvtier/client.h"

namespace kvtier::python {
namespace {

// Payloads cross by copy: a view into the arena that outlived its lease or reservation could
// read a reused slot or write into a committed one.
size_t CheckReserved(const ChunkReservation& r, int64_t k_arg) {
  const size_t k = IndexFrom(k_arg, "k");
  if (k >= r.size()) {
    throw StatusError(Status::InvalidArgument("k: reserved chunk " + std::to_string(k) +
                                              " does not exist (size " + std::to_string(r.size()) +
                                              ")"));
  }
  return k;
}

}  // namespace

void BindResults(nb::module_& m) {
  nb::class_<NamespaceHandle>(
      m, "Namespace",
      "A namespace this client opened (Client.open_namespace): everything that makes KV bytes "
      "comparable, its digest and the size of one chunk payload.")
      .def_prop_ro(
          "id", [](const NamespaceHandle& h) { return h.id.ToHex(); },
          "The namespace digest (XXH3-128 of the canonical spec), 32 hex digits.")
      .def_prop_ro("model_id", [](const NamespaceHandle& h) { return h.spec.model_id; })
      .def_prop_ro("lora_id", [](const NamespaceHandle& h) { return h.spec.lora_id; })
      .def_prop_ro(
          "kv_dtype", [](const NamespaceHandle& h) { return h.spec.kv_dtype; },
          "kvtier's dtype name: fp16, bf16, fp32, fp8_e4m3, fp8_e5m2 or int8.")
      .def_prop_ro(
          "layout", [](const NamespaceHandle& h) { return h.spec.layout; }, "'mha' or 'mla'.")
      .def_prop_ro("num_layers", [](const NamespaceHandle& h) { return h.spec.num_layers; })
      .def_prop_ro("num_kv_heads", [](const NamespaceHandle& h) { return h.spec.num_kv_heads; })
      .def_prop_ro("head_dim", [](const NamespaceHandle& h) { return h.spec.head_dim; })
      .def_prop_ro("latent_dim", [](const NamespaceHandle& h) { return h.spec.latent_dim; })
      .def_prop_ro(
          "chunk_tokens", [](const NamespaceHandle& h) { return h.spec.chunk_tokens; },
          "Tokens per chunk; only full chunks are stored.")
      .def_prop_ro("tp_rank", [](const NamespaceHandle& h) { return h.spec.tp_rank; })
      .def_prop_ro("tp_size", [](const NamespaceHandle& h) { return h.spec.tp_size; })
      .def_prop_ro("cache_salt", [](const NamespaceHandle& h) { return h.spec.cache_salt; })
      .def_prop_ro(
          "engine_keyed", [](const NamespaceHandle& h) { return h.spec.engine_keyed; },
          "Whether the engine's page hashes name the chunks (see open_namespace).")
      .def_prop_ro(
          "payload_bytes", [](const NamespaceHandle& h) { return h.layout.payload_bytes; },
          "Bytes of one chunk payload: layer-major [num_layers][K,V][chunk_tokens]"
          "[num_kv_heads][head_dim] (MLA: [num_layers][chunk_tokens][latent_dim]).")
      .def_prop_ro(
          "layer_bytes", [](const NamespaceHandle& h) { return h.spec.LayerBytes(); },
          "Bytes of one layer of one chunk payload (a contiguous range of it).")
      .def("__repr__", [](const NamespaceHandle& h) {
        return "kvtier.Namespace(" + h.spec.RedactedString() + ")";
      });

  nb::class_<LookupResult>(m, "LookupResult", "What Client.lookup found.")
      .def_ro("cached_tokens", &LookupResult::cached_tokens,
              "Leading tokens cached: num_chunks * chunk_tokens.")
      .def_ro("num_chunks", &LookupResult::num_chunks, "Leading full chunks cached.")
      .def_prop_ro(
          "fail_open", [](const LookupResult& r) { return FailOpenOf(r.fail_open); },
          "None, or why the cache failed open (reported a miss): 'CODE: message'.");

  nb::class_<LoadResult>(m, "LoadResult", "What Client.load copied.")
      .def_ro("loaded_tokens", &LoadResult::loaded_tokens,
              "Tokens whose KV was copied: num_chunks * chunk_tokens.")
      .def_ro("num_chunks", &LoadResult::num_chunks,
              "Chunks copied; only out[0 : num_chunks * payload_bytes] is valid.")
      .def_ro("nvme_chunks", &LoadResult::nvme_chunks,
              "Of num_chunks, the trailing ones the daemon promoted from NVMe.")
      .def_ro("prefetched_chunks", &LoadResult::prefetched_chunks,
              "Of num_chunks, those a prefetch promoted from NVMe in time.")
      .def_ro("remote_chunks", &LoadResult::remote_chunks,
              "Of num_chunks, the trailing ones the daemon read from the remote tier (counted "
              "in nvme_chunks or prefetched_chunks too).")
      .def_prop_ro(
          "lookup_us",
          [](const LoadResult& r) { return static_cast<int64_t>(r.lookup_time.count()); },
          "Microseconds of the Lookup-with-lease RPC.")
      .def_prop_ro(
          "fail_open", [](const LoadResult& r) { return FailOpenOf(r.fail_open); },
          "None, or why the cache failed open (a miss): 'CODE: message'.");

  nb::class_<StoreResult>(m, "StoreResult", "What Client.store (or a commit) stored.")
      .def_ro("stored_chunks", &StoreResult::stored_chunks, "Chunks written and committed now.")
      .def_ro("already_stored_chunks", &StoreResult::already_stored_chunks, "Chunks cached before.")
      .def_ro("being_written_chunks", &StoreResult::being_written_chunks,
              "Chunks another client's reservation is writing: stored when it commits, if it "
              "does; not counted as stored.")
      .def_ro("dropped_chunks", &StoreResult::dropped_chunks,
              "Chunks not stored: no space, or their parent was evicted meanwhile.")
      .def_ro("stored_bytes", &StoreResult::stored_bytes, "Payload bytes written.")
      .def_prop_ro(
          "fail_open", [](const StoreResult& r) { return FailOpenOf(r.fail_open); },
          "None, or why the write was dropped: 'CODE: message'.");

  nb::class_<PrefetchTicket>(
      m, "PrefetchTicket",
      "A prefetch in progress (Client.prefetch); hand it to load/acquire of the same tokens on "
      "the same client. Tied to its session: after a reconnect it is ignored.")
      .def(
          "__init__",
          [](PrefetchTicket* t, uint64_t id, uint64_t session_id) {
            new (t) PrefetchTicket{};
            t->id = id;
            t->session_id = session_id;
          },
          nb::arg("id"), nb::arg("session_id"),
          "Another process's ticket, from its id and session_id (vLLM's scheduler prefetches, "
          "a worker loads): acquire/start_load with the same request_id take it over.")
      .def_ro("id", &PrefetchTicket::id, "0 when nothing is cached or the call failed open.")
      .def_ro("session_id", &PrefetchTicket::session_id, "The session it belongs to.")
      .def_ro("total_chunks", &PrefetchTicket::total_chunks,
              "Chunks of the cached prefix: those in DRAM, then those on NVMe.")
      .def_ro("nvme_chunks", &PrefetchTicket::nvme_chunks,
              "Of total_chunks, those being promoted from NVMe.")
      .def_ro("remote_chunks", &PrefetchTicket::remote_chunks,
              "Of total_chunks, the last ones, being promoted from the remote tier.")
      .def_ro("ready_chunks", &PrefetchTicket::ready_chunks, "Chunks in DRAM at the call.")
      .def_prop_ro("policy",
                   [](const PrefetchTicket& t) { return PrefetchPolicyName(t.options.policy); })
      .def_prop_ro(
          "fail_open", [](const PrefetchTicket& t) { return FailOpenOf(t.fail_open); },
          "None, or why the cache failed open: 'CODE: message'.");

  nb::class_<PrefetchProgress>(m, "PrefetchProgress", "How far a prefetch got.")
      .def_ro("ready_chunks", &PrefetchProgress::ready_chunks,
              "Leading chunks in DRAM, held for the load.")
      .def_ro("total_chunks", &PrefetchProgress::total_chunks)
      .def_ro("hbm_chunks", &PrefetchProgress::hbm_chunks,
              "Leading chunks also in HBM (prefetch with to_hbm).")
      .def_ro("hbm_done", &PrefetchProgress::hbm_done, "to_hbm: no more will go into HBM.")
      .def_ro("done", &PrefetchProgress::done, "No more chunks will become ready.")
      .def_prop_ro(
          "fail_open", [](const PrefetchProgress& p) { return FailOpenOf(p.fail_open); },
          "None, or why: the ticket is gone or the daemon did not answer.");

  auto lease =
      nb::class_<ChunkLease>(
          m, "ChunkLease",
          "A lease on the cached prefix of a prompt (Client.acquire). The payloads stay in place "
          "in the shared arena until release() or the end of the `with` block; read() copies "
          "them out. After reading, call valid_chunks() before trusting what was read.")
          .def_prop_ro("num_chunks", &ChunkLease::num_chunks,
                       "Leading chunks leased (0 on a miss or a fail-open).")
          .def(
              "read",
              [](ChunkLease& lease, int64_t i_arg, nb::handle out) -> nb::object {
                const size_t i = IndexFrom(i_arg, "i");
                if (!lease.held()) {
                  throw StatusError(Status::FailedPrecondition(
                      lease.num_chunks() == 0 ? "read: nothing was leased (a miss)"
                                              : "read: the lease was released"));
                }
                if (i >= lease.num_chunks()) {
                  throw StatusError(Status::InvalidArgument(
                      "i: chunk " + std::to_string(i) + " is not leased (num_chunks " +
                      std::to_string(lease.num_chunks()) + ")"));
                }
                std::span<const std::byte> p = lease.payload(i);
                if (out.is_none()) {
                  nb::bytes copy(p.data(), p.size());
                  return copy;
                }
                nb::object holder;
                std::span<std::byte> dst = BytesOf(out, /*writable=*/true, "out", &holder);
                if (dst.size() < p.size()) {
                  throw StatusError(Status::InvalidArgument("out: " + std::to_string(dst.size()) +
                                                            " bytes, fewer than the payload's " +
                                                            std::to_string(p.size())));
                }
                {
                  nb::gil_scoped_release release;
                  std::memcpy(dst.data(), p.data(), p.size());
                }
                return nb::none();
              },
              nb::arg("i"), nb::arg("out").none() = nb::none(),
              nb::sig("def read(self, i: int, out: typing.Any = None) -> bytes | None"),
              "Copies chunk i's payload (payload_bytes) out of the shared arena: into `out` (a "
              "writable C-contiguous CPU buffer of at least payload_bytes; returns None), or into "
              "new bytes. Check valid_chunks() after reading: a lease that lapsed past its TTL "
              "may have let the slot be reused.\n\n"
              "Raises FailedPrecondition after release(), InvalidArgument when i >= num_chunks "
              "or `out` is too small, read-only or not contiguous.")
          .def("valid_chunks", &ChunkLease::ValidChunks, nb::call_guard<nb::gil_scoped_release>(),
               "After copying: how many leading chunks still hold what they held when leased "
               "(a lease that lapsed past its TTL shortens the prefix).")
          .def("release", &ChunkLease::Release, nb::call_guard<nb::gil_scoped_release>(),
               "Ends the lease (in the background). Idempotent.")
          .def_ro("nvme_chunks", &ChunkLease::nvme_chunks,
                  "Of num_chunks, the trailing ones promoted from NVMe.")
          .def_ro("prefetched_chunks", &ChunkLease::prefetched_chunks)
          .def_ro("remote_chunks", &ChunkLease::remote_chunks)
          .def_ro("hbm_chunks", &ChunkLease::hbm_chunks)
          .def_prop_ro(
              "fail_open", [](const ChunkLease& l) { return FailOpenOf(l.fail_open); },
              "None, or why the cache failed open (a miss): 'CODE: message'.");

  DefContextManager(lease, [](ChunkLease& l) { l.Release(); });

  auto reservation =
      nb::class_<PyReservation>(
          m, "ChunkReservation",
          "Arena slots reserved for the chunks of a prompt not yet stored (Client.reserve). "
          "write(k, data) every chunk, then commit(); leaving the `with` block without commit() "
          "aborts, and nothing half-written ever becomes visible.")
          .def(
              "__len__", [](const PyReservation& p) { return p.r.size(); }, "Chunks to write.")
          .def(
              "chunk_index",
              [](const PyReservation& p, int64_t k) {
                return p.r.chunk_index(CheckReserved(p.r, k));
              },
              nb::arg("k"),
              "Index of reserved chunk k among the prompt's full chunks. Raises InvalidArgument "
              "when k is negative or >= len(self).")
          .def(
              "write",
              [](PyReservation& p, int64_t k_arg, nb::handle data) {
                if (!p.r.writable()) {
                  throw StatusError(Status::FailedPrecondition(
                      "write: the reservation was committed or aborted (or holds nothing)"));
                }
                const size_t k = CheckReserved(p.r, k_arg);
                nb::object holder;
                std::span<std::byte> src = BytesOf(data, /*writable=*/false, "data", &holder);
                std::span<std::byte> dst = p.r.payload(k);
                if (src.size() != dst.size()) {
                  throw StatusError(Status::InvalidArgument("data: " + std::to_string(src.size()) +
                                                            " bytes, not the payload's " +
                                                            std::to_string(dst.size())));
                }
                {
                  nb::gil_scoped_release release;
                  std::memcpy(dst.data(), src.data(), src.size());
                }
                p.written[k] = true;
              },
              nb::arg("k"), nb::arg("data"),
              "Copies `data` (exactly payload_bytes, a C-contiguous CPU buffer: layer-major "
              "[num_layers][K,V][chunk_tokens][num_kv_heads][head_dim]) into reserved chunk k's "
              "slot. Nothing is visible before commit().\n\n"
              "Raises FailedPrecondition after commit() or abort(), InvalidArgument when k is "
              "negative or >= len(self), or data has another size.")
          .def(
              "commit",
              [](PyReservation& p) {
                for (size_t k = 0; k < p.written.size() && p.r.writable(); ++k) {
                  if (!p.written[k]) {
                    throw StatusError(Status::FailedPrecondition(
                        "commit: reserved chunk " + std::to_string(k) +
                        " was not written (write every chunk, or abort)"));
                  }
                }
                nb::gil_scoped_release release;
                return ValueOrThrow(p.r.Commit());
              },
              "Makes the written chunks visible. Raises FailedPrecondition when a reserved chunk "
              "was not written, or when already committed or aborted; daemon trouble is a "
              "fail_open in the result.")
          .def(
              "abort", [](PyReservation& p) { p.r.Abort(); },
              nb::call_guard<nb::gil_scoped_release>(), "Drops the reservation. Idempotent.")
          .def_prop_ro("already_stored_chunks",
                       [](const PyReservation& p) { return p.r.already_stored_chunks; })
          .def_prop_ro("being_written_chunks",
                       [](const PyReservation& p) { return p.r.being_written_chunks; })
          .def_prop_ro("dropped_chunks", [](const PyReservation& p) { return p.r.dropped_chunks; })
          .def_prop_ro("fail_open",
                       [](const PyReservation& p) { return FailOpenOf(p.r.fail_open); });
  DefContextManager(reservation, [](PyReservation& p) { p.r.Abort(); });
}

}  // namespace kvtier::python
