#include "kvtier/tiers/hbm_tier.h"

#include <spdlog/spdlog.h>

#include <cstddef>
#include <vector>

#include "kvtier/slot_image.h"

namespace kvtier {
namespace {

constexpr uint64_t kZeroSequence = 0;

// The device runtime's status as ours, prefixed with what was being done.
Status HbmError(const gpu::GpuStatus& st, const std::string& what) {
  const std::string message = "hbm: " + what + ": " + st.message();
  switch (st.code()) {
    case gpu::GpuCode::kInvalidArgument:
      return Status::InvalidArgument(message);
    case gpu::GpuCode::kOutOfMemory:
      return Status::ResourceExhausted(message);
    default:
      return Status::Unavailable(message);
  }
}

}  // namespace

Result<HbmBackend> ParseHbmBackend(const std::string& name) {
  if (name == "cuda") return HbmBackend::kCuda;
  if (name == "host") return HbmBackend::kHost;
  return Status::InvalidArgument("gpu_backend '" + name +
                                 "' is unknown (cuda; host emulates the GPU for tests)");
}

Result<std::unique_ptr<HbmTier>> HbmTier::Create(const HbmTierOptions& options, const Arena* dram) {
  if (options.bytes == 0 || options.bytes % 4096 != 0) {
    return Status::InvalidArgument("hbm_bytes " + std::to_string(options.bytes) +
                                   " is not a positive multiple of 4096");
  }
  if (options.device < 0) {
    return Status::InvalidArgument("hbm: gpu " + std::to_string(options.device) + " is negative");
  }
  std::unique_ptr<gpu::Runtime> runtime;
  if (options.backend == HbmBackend::kHost) {
    runtime = gpu::Runtime::CreateHost();
  } else if (gpu::GpuStatus st = gpu::Runtime::CreateCuda(options.device, &runtime); !st.ok()) {
    Status s =
        HbmError(st, "--hbm-bytes needs a CUDA GPU (--gpu " + std::to_string(options.device) + ")");
    if (s.code() != StatusCode::kUnavailable) return s;
    return Status::Unavailable(s.message() +
                               " (no usable NVIDIA GPU or driver here); run "
                               "without --hbm-bytes (or with hbm_bytes: 0) to keep the KV cache "
                               "off the GPU (DRAM, and NVMe when on)");
  }
  std::unique_ptr<HbmTier> tier(new HbmTier(options, std::move(runtime)));
  gpu::Runtime& rt = *tier->runtime_;
  if (gpu::GpuStatus st = rt.AllocateExported(options.bytes, &tier->pool_, &tier->ipc_handle_);
      !st.ok()) {
    return HbmError(st, "allocating and exporting a pool of " + std::to_string(options.bytes) +
                            " bytes on " + std::string(rt.name()));
  }
  if (gpu::GpuStatus st = rt.CreateStream(&tier->stream_); !st.ok()) {
    return HbmError(st, "creating the copy stream");
  }
  if (dram != nullptr) {
    gpu::GpuStatus st =
        rt.RegisterHost(dram->base(), dram->bytes(), gpu::PinOptions(), &tier->dram_pin_);
    if (!st.ok()) {  // still correct, only slower: copies then stage through the driver
      spdlog::warn(
          "hbm: could not pin the DRAM arena ({}); copies into HBM run from pageable "
          "memory",
          st.ToString());
    }
  }
  spdlog::info("HBM tier: {} bytes on {}, exported for clients ({})", options.bytes, rt.name(),
               options.backend == HbmBackend::kHost ? "shared host memory: emulation" : "CUDA IPC");
  return tier;
}

HbmTier::~HbmTier() {
  std::lock_guard lock(copy_mu_);
  if (stream_.valid()) (void)runtime_->Synchronize(stream_);
}

const char* HbmTier::backend_name() const {
  return options_.backend == HbmBackend::kHost ? "host" : "cuda";
}

Status HbmTier::CopyIn(uint64_t slot_offset, const std::byte* image, const SlotLayout& layout,
                       uint64_t sequence) {
  auto* slot = static_cast<std::byte*>(pool_.data()) + slot_offset;
  std::vector<std::byte> header(image, image + layout.header_bytes);
  RestampSlotSequence(header.data(), layout, sequence);
  gpu::Runtime& rt = *runtime_;
  std::lock_guard lock(copy_mu_);
  gpu::GpuStatus st = rt.CopyAsync(slot + offsetof(SlotHeader, sequence), &kZeroSequence,
                                   sizeof(kZeroSequence), stream_);
  if (st.ok()) {
    st = rt.CopyAsync(slot + layout.header_bytes, image + layout.header_bytes,
                      layout.slot_bytes - layout.header_bytes, stream_);
  }
  if (st.ok()) st = rt.CopyAsync(slot, header.data(), layout.header_bytes, stream_);
  if (gpu::GpuStatus done = rt.Synchronize(stream_); st.ok()) st = done;
  return st.ok() ? Status::Ok() : HbmError(st, "copying a chunk into HBM");
}

}  // namespace kvtier
