// kvtier_consumer SOCKET VERSION MODEL: one round trip through an installed kvtier SDK against
// a running kvtierd. Stores a 4-chunk prompt in a namespace of model id MODEL (a fresh one
// per run: a second run in the same one would find the chunks stored), loads it back,
// compares the bytes, and checks the daemon's Health version is VERSION. Prints one line per
// step; exit 0 when all pass.
#include <kvtier/admin_client.h>
#include <kvtier/client.h>
#include <kvtier/layerwise.h>  // the GPU-facing header and the gpu/ headers it pulls in

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "kvtier_consumer: FAIL: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return Fail("usage: kvtier_consumer SOCKET VERSION MODEL");
  const std::string socket = argv[1];
  const std::string version = argv[2];

  kvtier::ClientOptions options;
  options.socket_path = socket;
  options.deadline = std::chrono::milliseconds(5000);
  options.connect_timeout = std::chrono::milliseconds(5000);
  options.client_name = "kvtier-install-test";
  auto client = kvtier::Client::Connect(options);
  if (!client.ok()) return Fail("Connect: " + client.status().message());
  if (!(*client)->connected()) return Fail("not connected to " + socket);

  kvtier::NamespaceSpec spec;
  spec.model_id = argv[3];
  spec.num_layers = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = 8;
  spec.chunk_tokens = 16;
  auto ns = (*client)->OpenNamespace(spec);
  if (!ns.ok()) return Fail("OpenNamespace: " + ns.status().message());

  constexpr size_t kChunks = 4;
  std::vector<int32_t> tokens(kChunks * spec.chunk_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(1000 + i);
  const size_t payload = ns->layout.payload_bytes;
  std::vector<std::byte> source(kChunks * payload);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 7 + 3);

  auto stored = (*client)->Store(*ns, tokens, source);
  if (!stored.ok()) return Fail("Store: " + stored.status().message());
  if (!stored->fail_open.ok()) return Fail("Store failed open: " + stored->fail_open.message());
  if (stored->stored_chunks != kChunks) {
    return Fail("Store stored " + std::to_string(stored->stored_chunks) + " chunks, not 4");
  }
  std::printf("stored %u chunks of %zu bytes\n", stored->stored_chunks, payload);

  std::vector<std::byte> loaded(source.size());
  auto load = (*client)->Load(*ns, tokens, loaded);
  if (!load.ok()) return Fail("Load: " + load.status().message());
  if (load->num_chunks != kChunks) {
    return Fail("Load found " + std::to_string(load->num_chunks) + " chunks, not 4 (" +
                load->fail_open.message() + ")");
  }
  if (std::memcmp(loaded.data(), source.data(), source.size()) != 0) {
    return Fail("loaded bytes differ from stored bytes");
  }
  std::printf("loaded %u chunks, bytes equal\n", load->num_chunks);

  auto admin = kvtier::AdminClient::Connect(socket, std::chrono::milliseconds(5000));
  if (!admin.ok()) return Fail("AdminClient::Connect: " + admin.status().message());
  auto health = (*admin)->Health();
  if (!health.ok()) return Fail("Health: " + health.status().message());
  if (!health->serving || health->version != version) {
    return Fail("Health: serving " + std::to_string(health->serving) + ", version '" +
                health->version + "', expected '" + version + "'");
  }
  std::printf("kvtierd %s serving\n", health->version.c_str());
  (*client)->Close();
  return 0;
}
