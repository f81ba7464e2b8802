// kvtierctl: the admin CLI of kvtierd.
//   kvtierctl [--socket PATH] [--json] stats | health | namespaces
// Human tables by default, --json for scripts. Exit codes: 0 OK (health:
// serving), 1 daemon unreachable or not serving, 2 usage error.
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "kvtier/chunk_key.h"
#include "kvtier/proto/convert.h"
#include "kvtier/socket_path.h"
#include "kvtier/units.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace {

namespace v1 = kvtier::v1;
using nlohmann::json;

json StatsJson(const v1::StatsResponse& s) {
  json tiers = json::array();
  for (const auto& t : s.tiers()) {
    tiers.push_back({{"name", t.name()},
                     {"capacity_bytes", t.capacity_bytes()},
                     {"used_bytes", t.used_bytes()},
                     {"capacity_chunks", t.capacity_chunks()},
                     {"chunks", t.chunks()},
                     {"hits", t.hits()},
                     {"misses", t.misses()},
                     {"evictions", t.evictions()},
                     {"read_bytes", t.read_bytes()},
                     {"write_bytes", t.write_bytes()}});
  }
  return {{"tiers", tiers},
          {"lookups", s.lookups()},
          {"lookup_tokens", s.lookup_tokens()},
          {"hit_tokens", s.hit_tokens()},
          {"token_hit_rate", s.lookup_tokens() ? double(s.hit_tokens()) / s.lookup_tokens() : 0.0},
          {"sessions", s.sessions()},
          {"active_leases", s.active_leases()},
          {"active_reservations", s.active_reservations()},
          {"uptime_s", s.uptime_s()}};
}

void PrintStats(const v1::StatsResponse& s) {
  std::printf("%-6s %12s %12s %10s %10s %10s %10s %10s %12s %12s\n", "tier", "capacity", "used",
              "cap_chunks", "chunks", "hits", "misses", "evictions", "read", "written");
  for (const auto& t : s.tiers()) {
    std::printf("%-6s %12s %12s %10llu %10llu %10llu %10llu %10llu %12s %12s\n", t.name().c_str(),
                kvtier::FormatBytes(t.capacity_bytes()).c_str(),
                kvtier::FormatBytes(t.used_bytes()).c_str(),
                static_cast<unsigned long long>(t.capacity_chunks()),
                static_cast<unsigned long long>(t.chunks()),
                static_cast<unsigned long long>(t.hits()),
                static_cast<unsigned long long>(t.misses()),
                static_cast<unsigned long long>(t.evictions()),
                kvtier::FormatBytes(t.read_bytes()).c_str(),
                kvtier::FormatBytes(t.write_bytes()).c_str());
  }
  std::printf("lookups %llu, lookup tokens %llu, hit tokens %llu (token hit rate %.4f)\n",
              static_cast<unsigned long long>(s.lookups()),
              static_cast<unsigned long long>(s.lookup_tokens()),
              static_cast<unsigned long long>(s.hit_tokens()),
              s.lookup_tokens() ? double(s.hit_tokens()) / s.lookup_tokens() : 0.0);
  std::printf("sessions %llu, active leases %llu, active reservations %llu, uptime %llu s\n",
              static_cast<unsigned long long>(s.sessions()),
              static_cast<unsigned long long>(s.active_leases()),
              static_cast<unsigned long long>(s.active_reservations()),
              static_cast<unsigned long long>(s.uptime_s()));
}

std::string Hex(const std::string& id) {
  auto key = kvtier::KeyFromWire(id);
  return key ? key->ToHex() : "?";
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket_path = kvtier::DefaultSocketPath();
  bool as_json = false;
  int timeout_ms = 2000;
  CLI::App app{"kvtierctl: admin CLI of kvtierd", "kvtierctl"};
  app.add_option("--socket", socket_path, "kvtierd socket")->capture_default_str();
  app.add_flag("--json", as_json, "print JSON instead of a table");
  app.add_option("--timeout-ms", timeout_ms, "deadline of the RPC")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  app.require_subcommand(1);
  auto* stats = app.add_subcommand("stats", "tier capacities, hits, evictions, bytes moved");
  auto* health = app.add_subcommand("health", "exit 0 when the daemon is serving");
  auto* namespaces = app.add_subcommand("namespaces", "namespaces the daemon holds");
  for (auto* sub : {stats, health, namespaces}) sub->add_flag("--json", as_json, "print JSON");
  CLI11_PARSE(app, argc, argv);

  auto channel = grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials());
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  auto fail = [&](const grpc::Status& st) {
    if (as_json) {
      std::printf("%s\n", json{{"serving", false}, {"error", st.error_message()}}.dump().c_str());
    } else {
      std::fprintf(stderr, "kvtierctl: kvtierd at %s: %s\n", socket_path.c_str(),
                   st.error_message().c_str());
    }
    return 1;
  };

  if (stats->parsed()) {
    v1::StatsResponse resp;
    grpc::Status st = stub->Stats(&ctx, v1::StatsRequest(), &resp);
    if (!st.ok()) return fail(st);
    if (as_json) {
      std::printf("%s\n", StatsJson(resp).dump(2).c_str());
    } else {
      PrintStats(resp);
    }
  } else if (health->parsed()) {
    v1::HealthResponse resp;
    grpc::Status st = stub->Health(&ctx, v1::HealthRequest(), &resp);
    if (!st.ok()) return fail(st);
    if (as_json) {
      std::printf("%s\n", json{{"serving", resp.serving()},
                               {"version", resp.version()},
                               {"pid", resp.pid()},
                               {"epoch", resp.epoch()}}
                              .dump(2)
                              .c_str());
    } else {
      std::printf("%s (kvtierd %s, pid %u, epoch %016llx)\n",
                  resp.serving() ? "serving" : "not serving", resp.version().c_str(), resp.pid(),
                  static_cast<unsigned long long>(resp.epoch()));
    }
    return resp.serving() ? 0 : 1;
  } else if (namespaces->parsed()) {
    v1::NamespacesResponse resp;
    grpc::Status st = stub->Namespaces(&ctx, v1::NamespacesRequest(), &resp);
    if (!st.ok()) return fail(st);
    if (as_json) {
      json arr = json::array();
      for (const auto& n : resp.namespaces()) {
        const auto s = kvtier::FromProto(n.spec());
        arr.push_back({{"namespace_id", Hex(n.namespace_id())},
                       {"model_id", s.model_id},
                       {"lora_id", s.lora_id},
                       {"kv_dtype", s.kv_dtype},
                       {"layout", s.layout},
                       {"num_layers", s.num_layers},
                       {"num_kv_heads", s.num_kv_heads},
                       {"head_dim", s.head_dim},
                       {"latent_dim", s.latent_dim},
                       {"chunk_tokens", s.chunk_tokens},
                       {"tp_rank", s.tp_rank},
                       {"tp_size", s.tp_size},
                       {"cache_salt", s.cache_salt.empty() ? "" : "(set)"},
                       {"chunks", n.chunks()},
                       {"slot_bytes", n.slot_bytes()}});
      }
      std::printf("%s\n", json{{"namespaces", arr}}.dump(2).c_str());
    } else {
      std::printf("%-32s %-28s %-5s %-4s %6s %6s %6s %6s %5s %10s %10s\n", "namespace_id", "model",
                  "dtype", "lay", "layers", "heads", "dim", "chunk", "tp", "chunks", "slot");
      for (const auto& n : resp.namespaces()) {
        const auto s = kvtier::FromProto(n.spec());
        std::printf("%-32s %-28s %-5s %-4s %6u %6u %6u %6u %2u/%-2u %10llu %10s\n",
                    Hex(n.namespace_id()).c_str(), s.model_id.substr(0, 28).c_str(),
                    s.kv_dtype.c_str(), s.layout.c_str(), s.num_layers, s.num_kv_heads,
                    s.layout == "mla" ? s.latent_dim : s.head_dim, s.chunk_tokens, s.tp_rank,
                    s.tp_size, static_cast<unsigned long long>(n.chunks()),
                    kvtier::FormatBytes(n.slot_bytes()).c_str());
      }
    }
  }
  return 0;
}
