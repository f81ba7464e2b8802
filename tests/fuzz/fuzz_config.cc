// Fuzz target: kvtierd's YAML config (ParseDaemonOptions with --config, daemon_options.h),
// with some of the flags that must win over the file.
//
// Input: the first byte picks flags (bit i adds kFlags[i]), the rest is the YAML file
// (written to a scratch file, since kvtierd reads its config by path). Checks, besides
// ASan/UBSan: nothing throws or aborts; a refused config is INVALID_ARGUMENT with a message;
// an accepted one validates, and each flag given won over the file.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "kvtier/daemon/daemon_options.h"
#include "kvtier/units.h"

namespace {

struct Flag {
  const char* name;
  const char* value;  // nullptr for a switch
};
constexpr Flag kFlags[] = {
    {"--dram-bytes", "64MiB"},
    {"--nvme-bytes", "0"},
    {"--lease-ttl-ms", "2500"},
    {"--rebuild-index", nullptr},
    {"--nvme-write-policy", "selective"},
    {"--gpu", "3"},
};

std::string ConfigPathNow() {
  return (std::filesystem::temp_directory_path() /
          ("kvtier-fuzz-config-" + std::to_string(getpid()) + ".yaml"))
      .string();
}

const std::string& ConfigPath() {
  static const std::string path = [] {
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove(ConfigPathNow(), ec);
    });
    return ConfigPathNow();
  }();
  return path;
}

bool Given(uint8_t picked, const char* name) {
  for (size_t i = 0; i < std::size(kFlags); ++i) {
    if ((picked >> i & 1) != 0 && std::string(kFlags[i].name) == name) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t picked = data[0];
  {
    std::ofstream out(ConfigPath(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  std::vector<std::string> args = {"kvtierd", "--config", ConfigPath()};
  for (size_t i = 0; i < std::size(kFlags); ++i) {
    if ((picked >> i & 1) == 0) continue;
    args.emplace_back(kFlags[i].name);
    if (kFlags[i].value != nullptr) args.emplace_back(kFlags[i].value);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int exit_code = 0;
  const auto parsed =
      kvtier::ParseDaemonOptions(static_cast<int>(argv.size()), argv.data(), &exit_code);
  FUZZ_CHECK(exit_code == -1, "a config asked for --help or --version");
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == kvtier::StatusCode::kInvalidArgument,
               "a refused config is not INVALID_ARGUMENT");
    FUZZ_CHECK(!parsed.status().message().empty(), "a refused config has no message");
    return 0;
  }
  const kvtier::DaemonOptions& o = *parsed;
  FUZZ_CHECK(o.Validate().ok(), "an accepted config does not validate");
  if (Given(picked, "--dram-bytes")) {
    FUZZ_CHECK(o.core.dram_bytes == 64 * kvtier::kMiB, "--dram-bytes lost to the file");
  }
  if (Given(picked, "--nvme-bytes")) {
    FUZZ_CHECK(o.core.nvme.paths.empty(), "--nvme-bytes 0 left an NVMe tier on");
  }
  if (Given(picked, "--lease-ttl-ms")) {
    FUZZ_CHECK(o.core.lease_ttl.count() == 2500, "--lease-ttl-ms lost to the file");
  }
  if (Given(picked, "--rebuild-index")) {
    FUZZ_CHECK(o.rebuild_index, "--rebuild-index was dropped");
  }
  if (Given(picked, "--gpu")) FUZZ_CHECK(o.core.hbm.device == 3, "--gpu lost to the file");
  if (Given(picked, "--nvme-write-policy") && !o.core.nvme.paths.empty()) {
    FUZZ_CHECK(o.core.nvme_write_policy == kvtier::NvmeWritePolicy::kSelective,
               "--nvme-write-policy lost to the file");
  }
  return 0;
}
