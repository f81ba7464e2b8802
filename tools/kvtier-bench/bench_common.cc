#include "bench_common.h"

#include <algorithm>
#include <cstring>

#include "kvtier/tools/synthetic_kv.h"

namespace kvtier::bench {

std::unique_ptr<Client> ConnectOrDie(const std::string& socket, bool control_ring) {
  ClientOptions o;
  o.socket_path = socket;
  o.control_ring = control_ring;
  o.deadline = std::chrono::milliseconds(10000);
  o.client_name = "kvtier-bench";
  auto c = Must(Client::Connect(o), "connect");
  if (!c->connected()) Die("kvtierd is not reachable at " + socket);
  return c;
}

std::unique_ptr<AdminClient> AdminStub(const std::string& socket) {
  return Must(AdminClient::Connect(socket, std::chrono::milliseconds(10000)), "admin");
}

std::vector<int32_t> UniquePrompt(uint64_t seed, size_t num_tokens) {
  std::vector<int32_t> t(num_tokens);
  for (size_t i = 0; i < num_tokens; ++i) {
    t[i] = tools::BlockToken(seed * 1000003 + i / 512, static_cast<uint32_t>(i % 512));
  }
  return t;
}

NamespaceSpec BenchSpec(uint64_t payload_bytes, const std::string& model) {
  NamespaceSpec s;
  s.model_id = model;
  s.num_layers = 1;
  s.num_kv_heads = 1;
  s.head_dim = 64;  // 2 (K,V) * 64 * 2 B = 256 B per token
  s.chunk_tokens = static_cast<uint32_t>(payload_bytes / 256);
  return s;
}

StoreLoadSeconds StoreLoadVerified(Client& client, const NamespaceHandle& ns,
                                   std::span<const int32_t> tokens, std::span<const std::byte> src,
                                   std::span<std::byte> dst, uint32_t chunks) {
  const auto t0 = Clock::now();
  auto st = Must(client.Store(ns, tokens, src), "store");
  const auto t1 = Clock::now();
  auto ld = Must(client.Load(ns, tokens, dst), "load");
  const auto t2 = Clock::now();
  if (st.stored_chunks != chunks || ld.num_chunks != chunks) {
    Die("stored " + std::to_string(st.stored_chunks) + " and loaded " +
        std::to_string(ld.num_chunks) + " of " + std::to_string(chunks) + " chunks (" +
        st.fail_open.ToString() + " / " + ld.fail_open.ToString() +
        "; a store is also cut short by kvtierd's --session-max-bytes, by default half the arena)");
  }
  if (std::memcmp(src.data(), dst.data(), src.size()) != 0) Die("loaded bytes differ from stored");
  return {Seconds(t1 - t0), Seconds(t2 - t1)};
}

NamespaceSpec LookupSpec(const std::string& model) {
  NamespaceSpec spec;
  spec.model_id = model;
  spec.num_layers = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = 64;
  spec.chunk_tokens = 256;
  return spec;
}

uint64_t StoreZerosOrDie(Client& client, const NamespaceHandle& ns,
                         std::span<const int32_t> tokens) {
  const uint64_t chunks = tokens.size() / ns.spec.chunk_tokens;
  auto st = Must(client.Store(ns, tokens,
                              [](size_t, std::span<std::byte> p) {
                                std::fill(p.begin(), p.end(), std::byte{0});
                                return Status::Ok();
                              }),
                 "store");
  if (st.stored_chunks + st.already_stored_chunks != chunks) Die("the prompt did not fit in DRAM");
  return chunks;
}

}  // namespace kvtier::bench
