// The layerwise loader and storer (client/include/kvtier/layerwise.h) with the gpu runtime
// they run on: torch CUDA tensors and streams on a GPU, CPU tensors on the host-emulation
// backend (tests, CI). Tensors are taken through DLPack with their shape and strides, so the
// layout kvtier copies to is the one the engine allocated.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "kvtier/layerwise.h"

namespace kvtier::python {
namespace {

using gpu::KvLayoutKind;

void ThrowIfGpuError(const gpu::GpuStatus& st, const std::string& what) {
  if (!st.ok()) throw StatusError(FromGpu(st, what));
}

KvLayoutKind KindFrom(const std::string& name) {
  for (KvLayoutKind k :
       {KvLayoutKind::kVllmBhnc, KvLayoutKind::kVllmFlashAttn, KvLayoutKind::kVllmFlashInfer,
        KvLayoutKind::kSglangMha, KvLayoutKind::kMla}) {
    if (name == gpu::KvLayoutKindName(k)) return k;
  }
  throw StatusError(Status::InvalidArgument(
      "kind: '" + name +
      "' is not one of vllm_bhnc, vllm_flash_attn, vllm_flashinfer, sglang_mha, mla"));
}

// An engine's paged KV cache as kvtier sees it, holding the engine's tensors alive.
struct PyPagedKvCache {
  PagedKvCache cache;
  std::vector<nb::ndarray<>> tensors;  // keep the engine's tensors alive
  int32_t device_type = 0;             // DLPack device of every tensor
  int32_t device_id = 0;
};

struct TensorShape {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  uint32_t elem_bytes = 0;
  int32_t device_type = 0;
  int32_t device_id = 0;
  bool operator==(const TensorShape&) const = default;
};

TensorShape ShapeOf(const nb::ndarray<>& t) {
  TensorShape s;
  for (size_t d = 0; d < t.ndim(); ++d) {
    s.shape.push_back(static_cast<int64_t>(t.shape(d)));
    s.strides.push_back(t.stride(d));
  }
  s.elem_bytes = static_cast<uint32_t>(t.itemsize());
  s.device_type = t.device_type();
  s.device_id = t.device_id();
  return s;
}

gpu::KvLayoutSpec SpecFrom(KvLayoutKind kind, const TensorShape& s,
                           std::optional<int64_t> page_size) {
  auto bad = [&](const std::string& why) {
    return StatusError(Status::InvalidArgument(std::string("layers: ") + why));
  };
  const size_t rank =
      kind == KvLayoutKind::kVllmBhnc                                                   ? 4
      : (kind == KvLayoutKind::kVllmFlashAttn || kind == KvLayoutKind::kVllmFlashInfer) ? 5
                                                                                        : 3;
  if (s.shape.size() != rank) {
    throw bad(std::string(gpu::KvLayoutKindName(kind)) + " tensors have " + std::to_string(rank) +
              " dimensions, got " + std::to_string(s.shape.size()));
  }
  gpu::KvLayoutSpec spec;
  spec.kind = kind;
  spec.elem_bytes = s.elem_bytes;
  spec.strides = s.strides;
  switch (kind) {
    case KvLayoutKind::kVllmFlashAttn:  // [2, num_blocks, block_size, heads, head_dim]
      if (s.shape[0] != 2) throw bad("vllm_flash_attn: dimension 0 must be 2 (K, V)");
      spec.num_blocks = s.shape[1];
      spec.block_size_tokens = s.shape[2];
      spec.num_kv_heads = s.shape[3];
      spec.head_dim = s.shape[4];
      break;
    case KvLayoutKind::kVllmFlashInfer:  // [num_blocks, 2, block_size, heads, head_dim]
      if (s.shape[1] != 2) throw bad("vllm_flashinfer: dimension 1 must be 2 (K, V)");
      spec.num_blocks = s.shape[0];
      spec.block_size_tokens = s.shape[2];
      spec.num_kv_heads = s.shape[3];
      spec.head_dim = s.shape[4];
      break;
    case KvLayoutKind::kSglangMha: {  // K and V: [num_tokens, heads, head_dim]
      const int64_t page = page_size.value_or(1);
      if (page <= 0 || s.shape[0] % page != 0) {
        throw bad("sglang_mha: page_size " + std::to_string(page) +
                  " must be positive and divide the pool's " + std::to_string(s.shape[0]) +
                  " tokens");
      }
      spec.num_blocks = s.shape[0] / page;
      spec.block_size_tokens = page;
      spec.num_kv_heads = s.shape[1];
      spec.head_dim = s.shape[2];
      break;
    }
    case KvLayoutKind::kVllmBhnc:  // [num_blocks, heads, block_size, 2 * head_dim]
      if (s.shape[3] % 2 != 0) throw bad("vllm_bhnc: dimension 3 must be 2 * head_dim (K, V)");
      spec.num_blocks = s.shape[0];
      spec.num_kv_heads = s.shape[1];
      spec.block_size_tokens = s.shape[2];
      spec.head_dim = s.shape[3] / 2;
      break;
    case KvLayoutKind::kMla:  // [num_blocks, block_size, latent_dim]
      spec.num_blocks = s.shape[0];
      spec.block_size_tokens = s.shape[1];
      spec.latent_dim = s.shape[2];
      break;
  }
  gpu::KvLayout layout;
  ThrowIfGpuError(gpu::KvLayout::Create(spec, &layout), "layers");
  return spec;
}

std::unique_ptr<PyPagedKvCache> MakeCache(const std::string& kind_name, nb::list layers,
                                          std::optional<int64_t> page_size,
                                          std::optional<std::vector<uint32_t>> group_layers) {
  const KvLayoutKind kind = KindFrom(kind_name);
  const bool pairs = kind == KvLayoutKind::kSglangMha;
  if (layers.size() == 0) throw StatusError(Status::InvalidArgument("layers: empty"));
  if (page_size && !pairs) {
    throw StatusError(Status::InvalidArgument(
        "page_size: only for sglang_mha (other layouts carry the block size in their shape)"));
  }
  auto out = std::make_unique<PyPagedKvCache>();
  std::optional<TensorShape> first;
  auto take = [&](nb::handle obj, size_t layer) {
    nb::ndarray<> t;
    if (!nb::try_cast(obj, t, false)) {
      throw StatusError(Status::InvalidArgument("layers[" + std::to_string(layer) +
                                                "]: expected a writable tensor (DLPack), got " +
                                                nb::type_name(obj.type()).c_str()));
    }
    TensorShape s = ShapeOf(t);
    if (!first) {
      first = s;
    } else if (!(s == *first)) {
      throw StatusError(Status::InvalidArgument(
          "layers[" + std::to_string(layer) +
          "]: shape, strides, dtype and device must be those of layers[0]"));
    }
    out->tensors.push_back(t);
    return t.data();
  };
  for (size_t i = 0; i < layers.size(); ++i) {
    gpu::LayerTensors lt;
    if (pairs) {
      nb::tuple kv;
      if (!nb::try_cast(layers[i], kv) || kv.size() != 2) {
        throw StatusError(Status::InvalidArgument("layers[" + std::to_string(i) +
                                                  "]: sglang_mha takes a (k, v) pair of tensors"));
      }
      lt.tensors[0] = take(kv[0], i);
      lt.tensors[1] = take(kv[1], i);
    } else {
      lt.tensors[0] = take(layers[i], i);
    }
    out->cache.layers.push_back(lt);
  }
  out->cache.layout = SpecFrom(kind, *first, page_size);
  if (group_layers) {
    out->cache.group_layers = *group_layers;
    auto groups = KvCacheGroups(out->cache);
    if (!groups.ok()) throw StatusError(groups.status());
  }
  out->device_type = first->device_type;
  out->device_id = first->device_id;
  return out;
}

// The cache's tensors must live where the runtime copies: CPU for host emulation, the
// runtime's own CUDA device otherwise.
void CheckDevice(const PyPagedKvCache& cache, gpu::Runtime& rt) {
  const bool host = rt.backend() == gpu::Backend::kHost;
  const int32_t want = host ? nb::device::cpu::value : nb::device::cuda::value;
  if (cache.device_type != want) {
    throw StatusError(Status::InvalidArgument(
        std::string("cache: the runtime '") + std::string(rt.name()) + "' needs " +
        (host ? "CPU tensors" : "CUDA tensors") + ", the cache's are on another device"));
  }
  if (!host && std::string(rt.name()) != "cuda:" + std::to_string(cache.device_id)) {
    throw StatusError(Status::InvalidArgument(std::string("cache: tensors on cuda:") +
                                              std::to_string(cache.device_id) + ", runtime on " +
                                              std::string(rt.name())));
  }
}

// `block_ids`: one block table (ints), or a tuple or list of them, one per KV cache
// group (vLLM's per-group block ids).
std::vector<std::vector<int32_t>> BlockTablesFrom(nb::handle block_ids) {
  const bool sequence = PyList_Check(block_ids.ptr()) || PyTuple_Check(block_ids.ptr());
  if (!sequence || PySequence_Fast_GET_SIZE(block_ids.ptr()) == 0) {
    return {TokensFrom(block_ids, "block_ids")};
  }
  PyObject* first = PySequence_Fast_ITEMS(block_ids.ptr())[0];
  nb::object index = nb::steal(PyNumber_Index(first));
  if (index.is_valid()) return {TokensFrom(block_ids, "block_ids")};
  PyErr_Clear();
  std::vector<std::vector<int32_t>> tables;
  for (nb::handle table : block_ids) {
    const std::string what = "block_ids[" + std::to_string(tables.size()) + "]";
    tables.push_back(TokensFrom(table, what.c_str()));
  }
  return tables;
}

}  // namespace

void BindLayerwise(nb::module_& m) {
  nb::class_<gpu::Runtime>(
      m, "Runtime",
      "The device runtime the layerwise copies run on: CUDA, or host emulation (CPU threads "
      "and memcpy; what tests use). Create one per process and keep it alive while any "
      "stream, arena, loader or storer made with it lives.")
      .def_static(
          "host", []() { return gpu::Runtime::CreateHost(); },
          "The host-emulation backend: 'device' memory is CPU memory. Never fails.")
      .def_static(
          "cuda",
          [](int device) {
            std::unique_ptr<gpu::Runtime> rt;
            gpu::GpuStatus st;
            {
              nb::gil_scoped_release release;
              st = gpu::Runtime::CreateCuda(device, &rt);
            }
            ThrowIfGpuError(st, "cuda runtime");
            return rt;
          },
          nb::arg("device") = 0,
          "The CUDA backend on device ordinal `device`. Raises Unavailable when built "
          "without CUDA or no GPU or driver is present, InvalidArgument for a bad ordinal.")
      .def_prop_ro(
          "name", [](const gpu::Runtime& rt) { return std::string(rt.name()); },
          "'host' or 'cuda:<device>'.")
      .def(
          "create_stream",
          [](gpu::Runtime& rt) {
            auto s = std::make_unique<gpu::Stream>();
            ThrowIfGpuError(rt.CreateStream(s.get()), "create_stream");
            return s;
          },
          nb::keep_alive<0, 1>(), "A new stream of this runtime (a load or store stream).")
      .def(
          "wrap_stream",
          [](gpu::Runtime& rt, uintptr_t handle) {
            auto s = std::make_unique<gpu::Stream>();
            ThrowIfGpuError(rt.WrapExternalStream(reinterpret_cast<void*>(handle), s.get()),
                            "wrap_stream");
            return s;
          },
          nb::arg("handle"), nb::keep_alive<0, 1>(),
          "Wraps a stream the caller owns, e.g. torch.cuda.current_stream().cuda_stream (0: "
          "the legacy default stream), without owning it. Raises Unavailable on the host "
          "backend (its streams are threads; use create_stream).")
      .def(
          "synchronize",
          [](gpu::Runtime& rt, gpu::Stream& s) {
            gpu::GpuStatus st;
            {
              nb::gil_scoped_release release;
              st = rt.Synchronize(s);
            }
            ThrowIfGpuError(st, "synchronize");
          },
          nb::arg("stream"), "Blocks until all work queued on `stream` so far has completed.");

  nb::class_<gpu::Stream>(m, "Stream", "A stream of a Runtime (Runtime.create_stream/wrap_stream).")
      .def_prop_ro(
          "handle",
          [](const gpu::Stream& s) { return reinterpret_cast<uintptr_t>(s.native_handle()); },
          "CUDA: the cudaStream_t as an int. Host backend: an opaque value.");

  nb::class_<GpuArena>(
      m, "GpuArena",
      "The client's arena mapping registered with a runtime (and the daemon's HBM pool, "
      "opened once). One per process and runtime; loaders and storers share it.")
      .def(nb::init<gpu::Runtime&>(), nb::arg("runtime"), nb::keep_alive<1, 2>())
      .def_prop_ro("held_arenas", &GpuArena::held_arenas)
      .def_prop_ro("held_pools", &GpuArena::held_pools);

  nb::class_<PyPagedKvCache>(
      m, "PagedKvCache",
      "An engine's paged KV cache: one entry per model layer, all of one shape, strides, "
      "dtype and device. kind and the tensors' shapes:\n"
      "  'vllm_bhnc':       [num_blocks, num_kv_heads, block_size, 2 * head_dim] (vLLM >= 0.33, "
      "K then V along the last dimension)\n"
      "  'vllm_flash_attn': [2, num_blocks, block_size, num_kv_heads, head_dim]\n"
      "  'vllm_flashinfer': [num_blocks, 2, block_size, num_kv_heads, head_dim]\n"
      "  'sglang_mha':      a (k, v) pair, each [num_tokens, num_kv_heads, head_dim]; "
      "page_size tokens per page (default 1)\n"
      "  'mla':             [num_blocks, block_size, latent_dim]\n"
      "Strides are taken from the tensors (HND caches and views fit). The tensors are kept "
      "alive by this object.")
      .def(
          "__init__",
          [](PyPagedKvCache* self, const std::string& kind, nb::list layers,
             std::optional<int64_t> page_size, std::optional<std::vector<uint32_t>> groups) {
            new (self) PyPagedKvCache(std::move(*MakeCache(kind, layers, page_size, groups)));
          },
          nb::arg("kind"), nb::arg("layers"), nb::arg("page_size").none() = nb::none(),
          nb::arg("group_layers").none() = nb::none(),
          nb::sig("def __init__(self, kind: str, layers: list[typing.Any], "
                  "page_size: int | None = None, group_layers: list[int] | None = None) "
                  "-> None"),
          "group_layers: KV cache groups (vLLM's hybrid allocator), each with a block table "
          "of its own: group g is the next group_layers[g] layers, and a chunk holds the "
          "groups in this order. None: one group. Raises InvalidArgument naming what does "
          "not fit (rank, a K/V dimension that is not 2, layers that differ, strides that "
          "alias, groups that do not add up to the layers).")
      .def_prop_ro("num_layers", [](const PyPagedKvCache& c) { return c.cache.layers.size(); })
      .def_prop_ro("num_groups",
                   [](const PyPagedKvCache& c) {
                     return c.cache.group_layers.empty() ? size_t{1} : c.cache.group_layers.size();
                   })
      .def_prop_ro("num_blocks", [](const PyPagedKvCache& c) { return c.cache.layout.num_blocks; })
      .def_prop_ro("block_size",
                   [](const PyPagedKvCache& c) { return c.cache.layout.block_size_tokens; });

  nb::class_<LayerwiseLoader>(
      m, "LayerwiseLoader",
      "Loads the cached prefix of one request layer by layer into an engine's paged KV "
      "cache. One per request in flight; not thread-safe.")
      .def(
          "__init__",
          [](LayerwiseLoader* self, Client& client, const NamespaceHandle& ns, GpuArena& arena,
             const PyPagedKvCache& cache, gpu::Runtime& runtime) {
            CheckDevice(cache, runtime);
            new (self) LayerwiseLoader(client, ns, arena, cache.cache, runtime);
          },
          nb::arg("client"), nb::arg("ns"), nb::arg("arena"), nb::arg("cache"), nb::arg("runtime"),
          nb::keep_alive<1, 2>(), nb::keep_alive<1, 4>(), nb::keep_alive<1, 5>(),
          nb::keep_alive<1, 6>(),
          "Raises InvalidArgument when the cache's tensors are not on the runtime's device.")
      .def(
          "start_load",
          [](LayerwiseLoader& l, nb::handle tokens, nb::handle block_ids, gpu::Stream& stream,
             const PrefetchTicket* ticket, size_t first_chunk, const std::string& request_id) {
            std::vector<int32_t> t = TokensFrom(tokens);
            std::vector<std::vector<int32_t>> b = BlockTablesFrom(block_ids);
            nb::gil_scoped_release release;
            return ValueOrThrow(l.StartLoad(t, b, stream, ticket, first_chunk, request_id));
          },
          nb::arg("tokens"), nb::arg("block_ids"), nb::arg("load_stream"),
          nb::arg("ticket").none() = nb::none(), nb::arg("first_chunk") = 0,
          nb::arg("request_id") = "",
          nb::keep_alive<1, 4>(),  // the loader queues on load_stream until finish()
          "Leases the cached prefix of `tokens`, then queues the first layers' copies into the "
          "engine blocks `block_ids` (the prompt's block table, or a tuple of them, one per KV "
          "cache group; -1 leaves a block out) on load_stream; wait_layer "
          "queues the later layers and finish the rest. Chunks before "
          "first_chunk are already in the engine's blocks: leased, not copied. request_id: "
          "as in Client.acquire. Returns the "
          "tokens cached through this load (whole chunks, at most what block_ids covers); a "
          "miss or an unreachable daemon gives 0.\n\n"
          "Raises InvalidArgument (layout not matching the namespace, load already started), "
          "Unavailable when the runtime refuses the copies.")
      .def(
          "wait_layer",
          [](LayerwiseLoader& l, int64_t layer, gpu::Stream& compute_stream) {
            nb::gil_scoped_release release;  // queues a layer's copies
            ThrowIfError(l.WaitLayer(layer, compute_stream));
          },
          nb::arg("layer"), nb::arg("compute_stream"),
          "Queues the copies of a layer more (two past `layer` by default), then makes work "
          "queued on compute_stream from now on wait until `layer` is in the cache (a stream "
          "wait, no host sync). Raises InvalidArgument for a layer out of "
          "range.")
      .def(
          "finish",
          [](LayerwiseLoader& l) {
            nb::gil_scoped_release release;
            return ValueOrThrow(l.Finish());
          },
          "Queues the layers not queued yet, waits for every copy, releases the lease and returns "
          "the block ids to recompute "
          "(ascending): chunks whose copy failed or whose lease lapsed; with several KV cache "
          "groups, each group's ids follow the previous group's. Raises "
          "InvalidArgument when no load was started.")
      .def_prop_ro("hbm_chunks", &LayerwiseLoader::hbm_chunks,
                   "Of the chunks delivered, those copied from the daemon's HBM pool.");

  nb::class_<LayerwiseStorer>(
      m, "LayerwiseStorer",
      "Stores the new chunks of one request layer by layer as the engine writes them. One "
      "per request in flight; not thread-safe.")
      .def(
          "__init__",
          [](LayerwiseStorer* self, Client& client, const NamespaceHandle& ns, GpuArena& arena,
             const PyPagedKvCache& cache, gpu::Runtime& runtime) {
            CheckDevice(cache, runtime);
            new (self) LayerwiseStorer(client, ns, arena, cache.cache, runtime);
          },
          nb::arg("client"), nb::arg("ns"), nb::arg("arena"), nb::arg("cache"), nb::arg("runtime"),
          nb::keep_alive<1, 2>(), nb::keep_alive<1, 4>(), nb::keep_alive<1, 5>(),
          nb::keep_alive<1, 6>(),
          "Raises InvalidArgument when the cache's tensors are not on the runtime's device.")
      .def(
          "start",
          [](LayerwiseStorer& s, nb::handle tokens, nb::handle block_ids, gpu::Stream& stream,
             size_t first_chunk) {
            std::vector<int32_t> t = TokensFrom(tokens);
            std::vector<std::vector<int32_t>> b = BlockTablesFrom(block_ids);
            nb::gil_scoped_release release;
            return ValueOrThrow(s.Start(t, b, stream, first_chunk));
          },
          nb::arg("tokens"), nb::arg("block_ids"), nb::arg("store_stream"),
          nb::arg("first_chunk") = 0,
          nb::keep_alive<1, 4>(),  // the storer copies on store_stream until finish()
          "Reserves arena slots for the full chunks of `tokens` from first_chunk on that are "
          "not cached; their KV is in the engine blocks `block_ids` (a table, or a tuple of them, "
          "one per KV cache group). Returns how many chunks "
          "it will store (0 when all are cached or the daemon is unreachable).\n\n"
          "Raises InvalidArgument (layout mismatch, block_ids too short, already started), "
          "Unavailable when the runtime refuses the copies.")
      .def(
          "layer_done",
          [](LayerwiseStorer& s, int64_t layer, gpu::Stream& compute_stream) {
            ThrowIfError(s.LayerDone(layer, compute_stream));
          },
          nb::arg("layer"), nb::arg("compute_stream"),
          "After the engine queued layer `layer`'s KV writes on compute_stream: copies that "
          "layer of every new chunk out on the store stream once they are done. Each layer "
          "once. Raises InvalidArgument (layer out of range or already done).")
      .def(
          "finish",
          [](LayerwiseStorer& s) {
            nb::gil_scoped_release release;
            return ValueOrThrow(s.Finish());
          },
          "Waits for every layer's copy, then commits the chunks, or aborts them all on any "
          "failure or missing layer. Raises InvalidArgument when not started.");
}

}  // namespace kvtier::python
