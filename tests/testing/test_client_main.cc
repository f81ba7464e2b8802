// kvtier_test_client: a tiny engine stand-in that integration tests run as a
// separate process (built only under tests/, never installed).
//
//   kvtier_test_client store-load --socket S [--seed N] [--requests K]
//       Multi-turn prompts (a prefix shared by every process, then per-seed
//       conversations that grow turn by turn, with partial tails). Per request:
//       Load (verify every loaded byte with CountPayloadErrors), Store the
//       missing chunks (FillPayload), Load again and verify. Prints one line
//       `RESULT {json}` and exits 0, or 3 on any verify error, 1 on an API
//       error (a non-OK Result), 2 on a usage error.
//
//   kvtier_test_client hold --socket S
//       Stores a prompt through the SDK, then opens its own Session stream with
//       raw gRPC stubs, takes a lease on that prompt (Lookup with acquire) that
//       it never releases and reserves a second prompt (ReserveWrite) that it
//       never commits. Prints `HOLDING {json}` and sleeps until killed.
//
//   crash-worker, read-back (the crash loop), die (the client-death loop) and
//   load (the load test): see test_client_modes.h.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "kvtier/client.h"
#include "kvtier/logging.h"
#include "kvtier/proto/convert.h"
#include "kvtier/proto/transport_args.h"
#include "kvtier/tools/model_presets.h"
#include "kvtier/tools/synthetic_kv.h"
#include "kvtier/v1/kvtier.grpc.pb.h"
#include "testing/test_client_modes.h"

namespace {

using kvtier::testclient::AppendTokens;
using kvtier::testclient::Common;
using kvtier::testclient::ConnectOrFail;
using kvtier::testclient::Mix;
using nlohmann::json;

int StoreLoad(const Common& c, uint64_t seed, uint64_t requests) {
  auto spec = kvtier::tools::ModelPreset(c.model, c.chunk_tokens);
  if (!spec.ok()) {
    std::fprintf(stderr, "kvtier_test_client: %s\n", spec.status().ToString().c_str());
    return 2;
  }
  auto client_or = ConnectOrFail(c, "kvtier_test_client store-load");
  if (!client_or.ok()) {
    std::fprintf(stderr, "kvtier_test_client: %s\n", client_or.status().ToString().c_str());
    return 1;
  }
  auto& client = *client_or;
  auto ns_or = client->OpenNamespace(*spec);
  if (!ns_or.ok()) {
    std::fprintf(stderr, "kvtier_test_client: %s\n", ns_or.status().ToString().c_str());
    return 1;
  }
  const kvtier::NamespaceHandle ns = *ns_or;
  const uint64_t pb = ns.layout.payload_bytes;
  const uint32_t ct = c.chunk_tokens;
  const uint32_t layers = spec->num_layers;

  // A prefix shared by every process (same stream for every seed), then
  // per-seed conversations.
  constexpr int kConversations = 3;
  std::vector<std::vector<int32_t>> conversations(kConversations);
  for (auto& conv : conversations) AppendTokens(&conv, /*stream=*/7, 0, 2 * ct);

  uint64_t verify_errors = 0, loaded_chunks = 0, reloaded_chunks = 0, stored_chunks = 0,
           already_stored_chunks = 0, dropped_chunks = 0, fail_open = 0, full_chunks = 0,
           short_reloads = 0, prompt_tokens = 0;
  std::vector<std::byte> buffer;
  auto verify = [&](const std::vector<kvtier::ChunkKey>& keys, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) {
      const uint64_t e = kvtier::tools::CountPayloadErrors(
          keys[i], layers, std::span<const std::byte>(buffer.data() + i * pb, pb));
      if (e != 0) {
        std::fprintf(stderr, "kvtier_test_client: chunk %u (%s): %llu bytes differ\n", i,
                     keys[i].ToHex().c_str(), static_cast<unsigned long long>(e));
        ++verify_errors;
      }
    }
  };
  for (uint64_t r = 0; r < requests; ++r) {
    auto& conv = conversations[r % kConversations];
    // Drop the previous partial tail, then grow by 1..3 chunks and a new tail.
    conv.resize(conv.size() / ct * ct);
    const uint64_t stream = Mix(seed * 1000 + r % kConversations);
    const uint64_t add = (1 + Mix(seed ^ r) % 3) * ct + Mix(r ^ 0x55) % ct;
    AppendTokens(&conv, stream, conv.size(), add);
    const std::vector<int32_t>& tokens = conv;
    const auto keys = kvtier::Client::ChunkKeys(ns, tokens);
    prompt_tokens += tokens.size();
    full_chunks += keys.size();
    buffer.assign(keys.size() * pb, std::byte{0});

    auto load = client->Load(ns, tokens, buffer);
    if (!load.ok()) {
      std::fprintf(stderr, "kvtier_test_client: Load: %s\n", load.status().ToString().c_str());
      return 1;
    }
    if (!load->fail_open.ok()) {
      ++fail_open;
      std::fprintf(stderr, "kvtier_test_client: Load failed open: %s\n",
                   load->fail_open.ToString().c_str());
    }
    verify(keys, load->num_chunks);
    loaded_chunks += load->num_chunks;

    auto store = client->Store(
        ns, tokens,
        [&](size_t i, std::span<std::byte> payload) {
          kvtier::tools::FillPayload(keys[i], layers, payload);
          return kvtier::Status::Ok();
        },
        load->num_chunks);
    if (!store.ok()) {
      std::fprintf(stderr, "kvtier_test_client: Store: %s\n", store.status().ToString().c_str());
      return 1;
    }
    if (!store->fail_open.ok()) {
      ++fail_open;
      std::fprintf(stderr, "kvtier_test_client: Store failed open: %s\n",
                   store->fail_open.ToString().c_str());
    }
    stored_chunks += store->stored_chunks;
    already_stored_chunks += store->already_stored_chunks;
    dropped_chunks += store->dropped_chunks;

    std::fill(buffer.begin(), buffer.end(), std::byte{0});
    auto reload = client->Load(ns, tokens, buffer);
    if (!reload.ok()) {
      std::fprintf(stderr, "kvtier_test_client: Load: %s\n", reload.status().ToString().c_str());
      return 1;
    }
    if (!reload->fail_open.ok()) ++fail_open;
    verify(keys, reload->num_chunks);
    reloaded_chunks += reload->num_chunks;
    if (reload->num_chunks < keys.size()) ++short_reloads;
  }
  const json result = {{"requests", requests},
                       {"prompt_tokens", prompt_tokens},
                       {"full_chunks", full_chunks},
                       {"loaded_chunks", loaded_chunks},
                       {"reloaded_chunks", reloaded_chunks},
                       {"short_reloads", short_reloads},
                       {"stored_chunks", stored_chunks},
                       {"already_stored_chunks", already_stored_chunks},
                       {"dropped_chunks", dropped_chunks},
                       {"fail_open", fail_open},
                       {"verify_errors", verify_errors}};
  std::printf("RESULT %s\n", result.dump().c_str());
  std::fflush(stdout);
  return verify_errors == 0 ? 0 : 3;
}

int Hold(const Common& c) {
  namespace v1 = kvtier::v1;
  auto spec = kvtier::tools::ModelPreset(c.model, c.chunk_tokens);
  if (!spec.ok()) return 2;
  const uint32_t ct = c.chunk_tokens;
  const uint32_t layers = spec->num_layers;

  // 1. Store prompt A (3 chunks) through the SDK, then end that session.
  std::vector<int32_t> prompt_a, prompt_b;
  AppendTokens(&prompt_a, Mix(getpid()) ^ 0xA, 0, 3 * ct);
  AppendTokens(&prompt_b, Mix(getpid()) ^ 0xB, 0, 4 * ct + ct / 2);
  uint32_t stored = 0;
  {
    auto client = ConnectOrFail(c, "kvtier_test_client hold (store)");
    if (!client.ok()) {
      std::fprintf(stderr, "kvtier_test_client: %s\n", client.status().ToString().c_str());
      return 1;
    }
    auto ns = (*client)->OpenNamespace(*spec);
    if (!ns.ok()) return 1;
    const auto keys = kvtier::Client::ChunkKeys(*ns, prompt_a);
    auto st = (*client)->Store(*ns, prompt_a, [&](size_t i, std::span<std::byte> payload) {
      kvtier::tools::FillPayload(keys[i], layers, payload);
      return kvtier::Status::Ok();
    });
    if (!st.ok() || !st->fail_open.ok() || st->stored_chunks != keys.size()) {
      std::fprintf(stderr, "kvtier_test_client: storing prompt A failed\n");
      return 1;
    }
    stored = st->stored_chunks;
  }

  // 2. A raw session that holds a lease and a reservation.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel =
      grpc::CreateCustomChannel("unix:" + c.socket, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::KvCache::NewStub(channel);
  auto deadline = [&] {
    return std::chrono::system_clock::now() + std::chrono::milliseconds(c.deadline_ms);
  };
  grpc::ClientContext session_ctx;  // no deadline: the stream lives until we die
  auto session = stub->Session(&session_ctx);
  v1::SessionHello hello;
  hello.set_client_name("kvtier_test_client hold");
  hello.set_pid(static_cast<uint32_t>(getpid()));
  v1::SessionOpened opened;
  if (!session->Write(hello) || !session->Read(&opened)) {
    std::fprintf(stderr, "kvtier_test_client: Session stream failed\n");
    return 1;
  }
  auto fail = [](const char* what, const grpc::Status& st) {
    std::fprintf(stderr, "kvtier_test_client: %s: %s\n", what, st.error_message().c_str());
    return 1;
  };

  v1::OpenNamespaceRequest onr;
  onr.set_session_id(opened.session_id());
  *onr.mutable_spec() = kvtier::ToProto(*spec);
  v1::OpenNamespaceResponse ons;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    ctx.AddMetadata(kvtier::kSessionTokenKey, opened.session_token());
    if (auto st = stub->OpenNamespace(&ctx, onr, &ons); !st.ok()) return fail("OpenNamespace", st);
  }
  const kvtier::NamespaceId ns_id = spec->Digest();

  v1::LookupRequest lr;
  lr.set_session_id(opened.session_id());
  lr.set_epoch(opened.epoch());
  lr.set_namespace_id(ns_id.ToBytes());
  lr.set_tokens(kvtier::PackTokens(prompt_a));
  lr.set_acquire(true);
  v1::LookupResponse lresp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    ctx.AddMetadata(kvtier::kSessionTokenKey, opened.session_token());
    if (auto st = stub->Lookup(&ctx, lr, &lresp); !st.ok()) return fail("Lookup", st);
  }
  if (lresp.lease_id() == 0 || lresp.num_chunks() == 0) {
    std::fprintf(stderr, "kvtier_test_client: Lookup of prompt A granted no lease\n");
    return 1;
  }

  const auto keys_b = kvtier::ComputeChunkKeys(ns_id, prompt_b, ct);
  v1::ReserveWriteRequest rw;
  rw.set_session_id(opened.session_id());
  rw.set_epoch(opened.epoch());
  rw.set_namespace_id(ns_id.ToBytes());
  for (size_t i = 0; i < keys_b.size(); ++i) {
    auto* chunk = rw.add_chunks();
    chunk->set_key(keys_b[i].ToBytes());
    chunk->set_parent_key((i == 0 ? ns_id : keys_b[i - 1]).ToBytes());
    chunk->set_tokens(kvtier::PackTokens(std::span<const int32_t>(prompt_b).subspan(i * ct, ct)));
  }
  v1::ReserveWriteResponse rresp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    ctx.AddMetadata(kvtier::kSessionTokenKey, opened.session_token());
    if (auto st = stub->ReserveWrite(&ctx, rw, &rresp); !st.ok()) return fail("ReserveWrite", st);
  }
  if (rresp.reservation_id() == 0 || rresp.chunks_size() == 0) {
    std::fprintf(stderr, "kvtier_test_client: ReserveWrite reserved nothing\n");
    return 1;
  }

  const json held = {{"stored_chunks", stored},
                     {"lease_id", lresp.lease_id()},
                     {"leased_chunks", lresp.num_chunks()},
                     {"reservation_id", rresp.reservation_id()},
                     {"reserved_chunks", rresp.chunks_size()},
                     {"slot_bytes", ons.slot_bytes()},
                     {"session_id", opened.session_id()}};
  std::printf("HOLDING %s\n", held.dump().c_str());
  std::fflush(stdout);
  for (;;) pause();
}

}  // namespace

int main(int argc, char** argv) {
  kvtier::LogToStderr(
      "kvtier_test_client");  // results go to stdout; logs, the SDK's too, to stderr
  Common c;
  uint64_t seed = 1, requests = 20;
  CLI::App app{"kvtier_test_client: test engine stand-in", "kvtier_test_client"};
  app.require_subcommand(1);
  auto* sl = app.add_subcommand("store-load", "store and load verified prompts");
  auto* hold = app.add_subcommand("hold", "hold a lease and a reservation until killed");
  for (auto* sub : {sl, hold}) {
    sub->add_option("--socket", c.socket, "kvtierd socket")->required();
    sub->add_option("--model", c.model, "tiny | qwen2.5-0.5b | llama3-8b");
    sub->add_option("--chunk-tokens", c.chunk_tokens, "tokens per chunk");
    sub->add_option("--deadline-ms", c.deadline_ms, "client deadline per RPC");
  }
  sl->add_option("--seed", seed, "prompt seed");
  sl->add_option("--requests", requests, "number of requests");
  namespace tc = kvtier::testclient;
  tc::CrashWorkerOptions cw;
  auto* crash = app.add_subcommand("crash-worker", "store, load and prefetch until SIGTERM");
  crash->add_option("--seed", cw.seed, "random seed");
  crash->add_option("--first-conversation", cw.first_conversation, "first conversation");
  crash->add_option("--conversations", cw.conversations, "its own conversations to grow");
  crash->add_option("--store-interval-ms", cw.store_interval_ms, "least time between turns");
  crash->add_option("--duration-ms", cw.duration_ms, "stop after this long (0: at SIGTERM)");
  uint64_t conversations = 0;
  std::string keys_out;
  auto* rb = app.add_subcommand("read-back", "load every chunk of the crash loop's conversations");
  rb->add_option("--conversations", conversations, "conversations [0, N)")->required();
  rb->add_option("--keys-out", keys_out, "file for the keys of the chunks served right");
  uint64_t die_seed = 1;
  auto* die = app.add_subcommand("die", "hold leases, reservations and tickets until killed");
  die->add_option("--seed", die_seed, "random seed");
  tc::LoadOptions lo;
  auto* load = app.add_subcommand("load", "concurrent clients over several namespaces");
  load->add_option("--clients", lo.clients, "client threads, one session each");
  load->add_option("--namespaces", lo.namespaces, "namespaces (1..4)");
  load->add_option("--conversations", lo.conversations, "conversations per namespace");
  load->add_option("--seconds", lo.seconds, "how long");
  load->add_option("--seed", lo.seed, "random seed");
  for (auto* sub : {crash, rb, die, load}) {
    sub->add_option("--socket", c.socket, "kvtierd socket")->required();
    sub->add_option("--model", c.model, "tiny | qwen2.5-0.5b | llama3-8b");
    sub->add_option("--chunk-tokens", c.chunk_tokens, "tokens per chunk");
    sub->add_option("--deadline-ms", c.deadline_ms, "client deadline per RPC");
  }
  CLI11_PARSE(app, argc, argv);
  if (sl->parsed()) return StoreLoad(c, seed, requests);
  if (crash->parsed()) return tc::CrashWorker(c, cw);
  if (rb->parsed()) return tc::ReadBack(c, conversations, keys_out);
  if (die->parsed()) return tc::Die(c, die_seed);
  if (load->parsed()) return tc::LoadRun(c, lo);
  return Hold(c);
}
