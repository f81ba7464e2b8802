// kvtier.Client: the SDK's Client in Python terms (client/include/kvtier/client.h holds the
// contract). Arguments are converted while the GIL is held; the GIL is released around every
// call into the daemon and every copy.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <optional>

#include "bindings.h"
#include "convert.h"
#include "kvtier/client.h"

namespace kvtier::python {
namespace {

using std::chrono::milliseconds;

size_t MaxChunks(std::optional<int64_t> max_chunks) {
  return max_chunks ? IndexFrom(*max_chunks, "max_chunks") : SIZE_MAX;
}

std::unique_ptr<Client> Connect(const std::string& socket, int64_t deadline_ms,
                                int64_t connect_timeout_ms, int64_t reconnect_interval_ms,
                                const std::string& client_name, bool control_ring) {
  ClientOptions options;
  options.control_ring = control_ring;
  options.socket_path = socket;
  options.deadline = milliseconds(deadline_ms);
  options.connect_timeout = milliseconds(connect_timeout_ms);
  options.reconnect_interval = milliseconds(reconnect_interval_ms);
  options.client_name = client_name;
  nb::gil_scoped_release release;
  return ValueOrThrow(Client::Connect(options));
}

NamespaceHandle OpenNamespace(Client& c, const std::string& model_id, int64_t num_layers,
                              nb::handle kv_dtype, const std::string& layout, int64_t num_kv_heads,
                              int64_t head_dim, int64_t latent_dim, int64_t chunk_tokens,
                              int64_t tp_rank, int64_t tp_size, const std::string& lora_id,
                              const std::string& cache_salt, bool engine_keyed) {
  NamespaceSpec spec;
  spec.model_id = model_id;
  spec.lora_id = lora_id;
  spec.kv_dtype = KvDtypeFrom(kv_dtype);
  spec.layout = layout;
  spec.num_layers = U32From(num_layers, "num_layers");
  spec.num_kv_heads = U32From(num_kv_heads, "num_kv_heads");
  spec.head_dim = U32From(head_dim, "head_dim");
  spec.latent_dim = U32From(latent_dim, "latent_dim");
  spec.chunk_tokens = U32From(chunk_tokens, "chunk_tokens");
  spec.tp_rank = U32From(tp_rank, "tp_rank");
  spec.tp_size = U32From(tp_size, "tp_size");
  spec.cache_salt = cache_salt;
  spec.engine_keyed = engine_keyed;
  nb::gil_scoped_release release;
  return ValueOrThrow(c.OpenNamespace(spec));
}

}  // namespace

void BindClient(nb::module_& m) {
  auto client =
      nb::class_<Client>(
          m, "Client",
          "A connection to kvtierd: one session, the shared DRAM arena mapped, control over the "
          "session's shared-memory ring and gRPC.\n\n"
          "The cache fails open: when the daemon is down, slower than the deadline or answers "
          "with an error, lookups and loads report a miss and stores drop the write, with the "
          "reason in the result's `fail_open`; the engine then recomputes. Errors that are the "
          "caller's own (a bad spec, a namespace not opened by this client, a buffer too small) "
          "raise. Thread-safe: threads may share one Client; the GIL is released during calls.")
          .def_static(
              "connect", &Connect, nb::arg("socket") = "", nb::arg("deadline_ms") = 100,
              nb::arg("connect_timeout_ms") = 2000, nb::arg("reconnect_interval_ms") = 100,
              nb::arg("client_name") = "kvtier-python", nb::arg("control_ring") = true,
              "Connects to kvtierd's socket ('' = ${XDG_RUNTIME_DIR:-/tmp}/kvtier/"
              "kvtierd.sock). deadline_ms bounds each RPC; connect_timeout_ms the first "
              "connection. control_ring: send lookups, releases and stores over the "
              "session's shared-memory ring, gRPC as the fallback (KVTIER_CONTROL_RING=0 "
              "also turns it off). A daemon that is down is not an error: the client starts "
              "disconnected, fails open and keeps reconnecting.\n\n"
              "Raises InvalidArgument for a nonpositive deadline or a socket path that is "
              "too long or not a socket.")
          .def("open_namespace", &OpenNamespace, nb::arg("model_id"), nb::arg("num_layers"),
               nb::arg("kv_dtype") = "fp16", nb::arg("layout") = "mha", nb::arg("num_kv_heads") = 0,
               nb::arg("head_dim") = 0, nb::arg("latent_dim") = 0, nb::arg("chunk_tokens") = 256,
               nb::arg("tp_rank") = 0, nb::arg("tp_size") = 1, nb::arg("lora_id") = "",
               nb::arg("cache_salt") = "", nb::arg("engine_keyed") = false,
               "Validates a namespace and registers it with the daemon (again after each "
               "reconnect). kv_dtype: a kvtier name (fp16, bf16, fp32, fp8_e4m3, fp8_e5m2, int8), "
               "a torch dtype or a numpy dtype. layout: 'mha' (num_kv_heads and head_dim of this "
               "TP rank) or 'mla' (latent_dim; tp_rank 0 of 1). engine_keyed: chunks are named by "
               "the "
               "engine's own page hashes (SGLang HiCache) instead of token ids: pass each chunk's "
               "32-byte hash as its first 8 int32 'token ids' (little-endian), zeros after; "
               "chunk_tokens (the page size) must then be >= 8.\n\n"
               "Raises InvalidArgument naming the bad field. A daemon that is down is not an "
               "error.")
          .def_static(
              "chunk_keys",
              [](const NamespaceHandle& ns, nb::handle tokens) {
                std::vector<int32_t> t = TokensFrom(tokens);
                std::vector<ChunkKey> keys;
                {
                  nb::gil_scoped_release release;
                  keys = Client::ChunkKeys(ns, t);
                }
                std::vector<nb::bytes> out;
                out.reserve(keys.size());
                for (const ChunkKey& k : keys) {
                  std::string b = k.ToBytes();
                  out.emplace_back(b.data(), b.size());
                }
                return out;
              },
              nb::arg("ns"), nb::arg("tokens"),
              "Keys of the full chunks of `tokens` (16 bytes each: low64 then high64, "
              "little-endian), computed locally. len = len(tokens) // chunk_tokens.")
          .def(
              "lookup",
              [](Client& c, const NamespaceHandle& ns, nb::handle tokens,
                 const std::string& request_id) {
                std::vector<int32_t> t = TokensFrom(tokens);
                nb::gil_scoped_release release;
                return ValueOrThrow(c.Lookup(ns, t, request_id));
              },
              nb::arg("ns"), nb::arg("tokens"), nb::arg("request_id") = "",
              "How many leading tokens of `tokens` are cached (full chunks only). tokens: a list "
              "of ints, or a 1-D int32/int64 numpy array or torch CPU tensor. request_id (here and "
              "in prefetch, load, acquire): the engine's id of the request the call serves, at "
              "most "
              "256 bytes, the same on the scheduler's and the workers' calls, so that kvtierd "
              "counts the request's token hit rate once; '' makes the call a request of its "
              "own.\n\n"
              "Raises InvalidArgument for bad tokens, a too long request_id or a namespace not "
              "opened by this client.")
          .def(
              "prefetch",
              [](Client& c, const NamespaceHandle& ns, nb::handle tokens, const std::string& policy,
                 int64_t deadline_ms, int64_t timeout_base_ms, int64_t timeout_per_1k_tokens_ms,
                 bool to_hbm, const std::string& request_id) {
                std::vector<int32_t> t = TokensFrom(tokens);
                PrefetchOptions o;
                o.policy = PrefetchPolicyFrom(policy);
                o.deadline = milliseconds(deadline_ms);
                o.timeout_base = milliseconds(timeout_base_ms);
                o.timeout_per_1k_tokens = milliseconds(timeout_per_1k_tokens_ms);
                o.to_hbm = to_hbm;
                nb::gil_scoped_release release;
                return ValueOrThrow(c.Prefetch(ns, t, o, request_id));
              },
              nb::arg("ns"), nb::arg("tokens"), nb::arg("policy") = "best_effort",
              nb::arg("deadline_ms") = 10000, nb::arg("timeout_base_ms") = 1000,
              nb::arg("timeout_per_1k_tokens_ms") = 250, nb::arg("to_hbm") = false,
              nb::arg("request_id") = "",
              "Prefetch on enqueue: the daemon promotes the NVMe chunks of the cached prefix into "
              "DRAM and holds the prefix for deadline_ms (1..600000) or until a load given the "
              "ticket. policy (what that load waits for): 'best_effort' (nothing), "
              "'wait_complete' (all ready), 'timeout' (timeout_base_ms + "
              "timeout_per_1k_tokens_ms per 1,000 prompt tokens).\n\n"
              "Raises InvalidArgument for a bad policy or deadline or a namespace not opened here.")
          .def("prefetch_status", &Client::PrefetchStatus, nb::arg("ticket"),
               nb::call_guard<nb::gil_scoped_release>(), "How far a prefetch got (one RPC).")
          .def(
              "load",
              [](Client& c, const NamespaceHandle& ns, nb::handle tokens, nb::handle out,
                 const PrefetchTicket* ticket, const std::string& request_id) {
                std::vector<int32_t> t = TokensFrom(tokens);
                nb::object holder;
                std::span<std::byte> dst = BytesOf(out, /*writable=*/true, "out", &holder);
                nb::gil_scoped_release release;
                return ValueOrThrow(c.Load(ns, t, dst, ticket, request_id));
              },
              nb::arg("ns"), nb::arg("tokens"), nb::arg("out"),
              nb::arg("ticket").none() = nb::none(), nb::arg("request_id") = "",
              "Loads the cached prefix of `tokens` into `out`, a writable C-contiguous CPU buffer "
              "(numpy array, torch CPU tensor, bytearray) of any dtype: chunk i's payload goes to "
              "bytes [i * payload_bytes, (i + 1) * payload_bytes); at most "
              "len(out bytes) // payload_bytes chunks. Only the first num_chunks chunks of `out` "
              "are valid. With `ticket` (a prefetch of the same tokens), waits as its policy "
              "says.\n\n"
              "Raises InvalidArgument for bad tokens, a read-only or non-contiguous `out`, or a "
              "namespace not opened here.")
          .def(
              "store",
              [](Client& c, const NamespaceHandle& ns, nb::handle tokens, nb::handle data,
                 int64_t first_chunk_arg) {
                const size_t first_chunk = IndexFrom(first_chunk_arg, "first_chunk");
                std::vector<int32_t> t = TokensFrom(tokens);
                nb::object holder;
                std::span<std::byte> src = BytesOf(data, /*writable=*/false, "data", &holder);
                nb::gil_scoped_release release;
                return ValueOrThrow(c.Store(ns, t, src, first_chunk));
              },
              nb::arg("ns"), nb::arg("tokens"), nb::arg("data"), nb::arg("first_chunk") = 0,
              "Stores the full chunks of `tokens` from index first_chunk on. data: a C-contiguous "
              "CPU buffer holding [len(tokens) // chunk_tokens][payload_bytes] bytes (from chunk "
              "0; chunks before first_chunk are not read).\n\n"
              "Raises InvalidArgument when data is shorter than that, for bad tokens, or a "
              "namespace not opened here.")
          .def(
              "acquire",
              [](Client& c, const NamespaceHandle& ns, nb::handle tokens,
                 std::optional<int64_t> max_chunks, const PrefetchTicket* ticket,
                 const std::string& request_id) {
                std::vector<int32_t> t = TokensFrom(tokens);
                nb::gil_scoped_release release;
                return ValueOrThrow(
                    c.Acquire(ns, t, MaxChunks(max_chunks), ticket, /*hbm=*/false, request_id));
              },
              nb::arg("ns"), nb::arg("tokens"), nb::arg("max_chunks").none() = nb::none(),
              nb::arg("ticket").none() = nb::none(), nb::arg("request_id") = "",
              nb::keep_alive<0, 1>(),
              "Leases the cached prefix of `tokens` (at most max_chunks chunks), pinned in the "
              "arena until release(): read(i) copies a chunk out. Use as a context manager; the "
              "lease ends with the block.\n\n"
              "Raises InvalidArgument for bad tokens or a namespace not opened here.")
          .def(
              "reserve",
              [](Client& c, const NamespaceHandle& ns, nb::handle tokens, int64_t first_chunk) {
                std::vector<int32_t> t = TokensFrom(tokens);
                const size_t first = IndexFrom(first_chunk, "first_chunk");
                Result<ChunkReservation> r = [&] {
                  nb::gil_scoped_release release;
                  return c.Reserve(ns, t, first);
                }();
                return PyReservation(ValueOrThrow(std::move(r)));
              },
              nb::arg("ns"), nb::arg("tokens"), nb::arg("first_chunk") = 0, nb::keep_alive<0, 1>(),
              "Reserves arena slots for the full chunks of `tokens` from first_chunk on that are "
              "not cached: store without the writes. Use as a context manager; write(k, data) "
              "every reserved chunk, then commit().\n\n"
              "Raises InvalidArgument for bad tokens or a namespace not opened here.")
          .def_prop_ro("connected", &Client::connected,
                       "True while a session with the daemon is open.")
          .def("close", &Client::Close, nb::call_guard<nb::gil_scoped_release>(),
               "Ends the session (the daemon frees this client's leases). Idempotent.");
  DefContextManager(client, [](Client& c) { c.Close(); });
}

}  // namespace kvtier::python
