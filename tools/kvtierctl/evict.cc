// kvtierctl health and evict.
#include <cstdio>

#include "ctl.h"

namespace kvtier::ctl {

using nlohmann::json;

int RunHealth(AdminClient& admin, const std::string& socket_path, bool as_json) {
  auto h = admin.Health();
  if (!h.ok()) return Fail(socket_path, as_json, h.status());
  if (as_json) {
    std::printf("%s\n", json{{"serving", h->serving},
                             {"version", h->version},
                             {"pid", h->pid},
                             {"epoch", h->epoch},
                             {"degraded_tiers", h->degraded_tiers}}
                            .dump(2)
                            .c_str());
  } else {
    std::string degraded;
    for (const auto& t : h->degraded_tiers) degraded += (degraded.empty() ? "" : ", ") + t;
    std::printf("%s%s (kvtierd %s, pid %u, epoch %016llx)\n",
                h->serving ? "serving" : "not serving",
                degraded.empty() ? "" : (", degraded: " + degraded).c_str(), h->version.c_str(),
                h->pid, static_cast<unsigned long long>(h->epoch));
  }
  return h->serving ? 0 : 1;
}

int RunEvict(AdminClient& admin, const std::string& socket_path, bool as_json,
             const EvictScope& scope) {
  auto tiers = admin.Evict(scope);
  if (!tiers.ok() && tiers.status().code() == StatusCode::kDeadlineExceeded) {
    // kvtierd goes on with an eviction whose caller stopped waiting.
    return Fail(socket_path, as_json,
                Status(StatusCode::kDeadlineExceeded,
                       tiers.status().message() +
                           "; kvtierd may still finish the eviction (its log says "
                           "what it removed): give a longer --timeout-ms to wait for it"));
  }
  if (!tiers.ok()) return Fail(socket_path, as_json, tiers.status());
  if (as_json) {
    json arr = json::array();
    for (const auto& t : *tiers)
      arr.push_back({{"tier", t.tier}, {"removed", t.removed}, {"kept", t.kept}});
    std::printf("%s\n", json{{"tiers", arr}}.dump(2).c_str());
  } else {
    std::printf("%-6s %10s %10s\n", "tier", "removed", "kept");
    uint64_t kept = 0;
    for (const auto& t : *tiers) {
      std::printf("%-6s %10llu %10llu\n", t.tier.c_str(),
                  static_cast<unsigned long long>(t.removed),
                  static_cast<unsigned long long>(t.kept));
      kept += t.kept;
    }
    uint64_t removed = 0;
    for (const auto& t : *tiers) removed += t.removed;
    if (removed == 0 && kept == 0) {
      std::printf(scope.all ? "nothing matched: no chunk is cached\n"
                            : "nothing matched: no chunk of that scope is cached (check the "
                              "namespace id with `kvtierctl namespaces`)\n");
    }
    if (kept > 0) {
      std::printf(
          "%llu chunks were kept: a lease, a read or a copy holds them (or a chunk after "
          "them); run evict again once they are released\n",
          static_cast<unsigned long long>(kept));
    }
  }
  return 0;
}

}  // namespace kvtier::ctl
