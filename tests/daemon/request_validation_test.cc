// CacheCore request validation, table-driven: one row per rejected field. Each
// row checks the status code, that the message names the field, and that the
// rejected request changed nothing (Stats + Namespaces snapshots, used bytes).
#include <gtest/gtest.h>

#include <functional>

#include "daemon/cache_core_harness.h"
#include "kvtier/daemon/cache_core.h"
#include "kvtier/daemon/core_wire.h"

namespace kvtier::testing {
namespace {

// State every row starts from: one namespace with a stored 2-chunk prompt, a
// lease and a reservation held by session A (session_), and a second session B.
class RequestValidationWorld : public CacheCoreDriver {
 public:
  void Build() {
    CacheCoreOptions o = Options(16);
    o.max_prompt_tokens = 64;
    o.max_chunks_per_request = 8;
    o.max_namespaces = 1;
    Start(o);
    stored_ = Tokens(8);
    ASSERT_EQ(Store(stored_), 2u);
    lease_ = Lookup(stored_, true).lease_id();
    reservation_ = Reserve(Tokens(4, 500)).reservation_id();
    ASSERT_NE(lease_, 0u);
    ASSERT_NE(reservation_, 0u);
    b_ = core_->OpenSession("b", ExitedPid());
  }
  std::string Snapshot() const {
    v1::NamespacesResponse ns;
    wire::Run(*core_, &ns);
    return Stats().DebugString() + ns.DebugString();
  }

  v1::LookupRequest LookupReq() const {
    v1::LookupRequest r;
    r.set_session_id(session_);
    r.set_epoch(kEpoch);
    r.set_namespace_id(ns_wire_);
    r.set_tokens(PackTokens(stored_));
    r.set_acquire(true);
    return r;
  }
  Status Do(const v1::LookupRequest& r) {
    v1::LookupResponse resp;
    return wire::Run(*core_, r, &resp);
  }
  // A valid 3-chunk ReserveWrite of a new prompt.
  v1::ReserveWriteRequest ReserveReq() const { return ReserveRequest(Tokens(12, 900), session_); }
  Status Do(const v1::ReserveWriteRequest& r) {
    v1::ReserveWriteResponse resp;
    return wire::Run(*core_, r, &resp);
  }
  Status Open(const std::function<void(v1::NamespaceSpec&)>& mutate, uint64_t session = 0) {
    v1::OpenNamespaceRequest r;
    r.set_session_id(session ? session : session_);
    *r.mutable_spec() = TinyProtoSpec();
    r.mutable_spec()->set_model_id("another-model");
    mutate(*r.mutable_spec());
    v1::OpenNamespaceResponse resp;
    return wire::Run(*core_, r, &resp);
  }
  Status Commit(uint64_t session, uint64_t reservation) {
    return CacheCoreDriver::Commit(reservation, nullptr, session);
  }
  Status Abort(uint64_t session, uint64_t reservation) {
    v1::AbortWriteRequest r;
    r.set_session_id(session);
    r.set_reservation_id(reservation);
    return wire::Run(*core_, r);
  }

  std::vector<int32_t> stored_;
  uint64_t lease_ = 0;
  uint64_t reservation_ = 0;
  uint64_t b_ = 0;
};

using W = RequestValidationWorld;

struct Row {
  const char* name;
  StatusCode code;
  const char* field;  // substring the message must contain
  std::function<Status(W&)> run;
};

void PrintTo(const Row& r, std::ostream* os) { *os << r.name; }

constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;
constexpr StatusCode kPrecondition = StatusCode::kFailedPrecondition;

std::string Bytes(size_t n) { return std::string(n, '\x01'); }

const Row kRows[] = {
    // ---- Lookup ----
    {"LookupTokensNotMultipleOf4", kInvalid, "tokens",
     [](W& w) {
       auto r = w.LookupReq();
       r.mutable_tokens()->pop_back();
       return w.Do(r);
     }},
    {"LookupTooManyTokens", kInvalid, "tokens",
     [](W& w) {
       auto r = w.LookupReq();
       r.set_tokens(PackTokens(Tokens(65)));
       return w.Do(r);
     }},
    {"LookupUnknownSession", kPrecondition, "session_id",
     [](W& w) {
       auto r = w.LookupReq();
       r.set_session_id(4242);
       return w.Do(r);
     }},
    {"LookupStaleEpoch", kPrecondition, "epoch",
     [](W& w) {
       auto r = w.LookupReq();
       r.set_epoch(W::kEpoch + 1);
       return w.Do(r);
     }},
    {"LookupNamespaceIdNot16Bytes", kInvalid, "namespace_id",
     [](W& w) {
       auto r = w.LookupReq();
       r.set_namespace_id(Bytes(15));
       return w.Do(r);
     }},
    {"LookupUnknownNamespace", StatusCode::kNotFound, "namespace_id",
     [](W& w) {
       auto r = w.LookupReq();
       r.set_namespace_id(Bytes(16));
       return w.Do(r);
     }},
    // ---- ReserveWrite ----
    {"ReserveEmptyChunks", kInvalid, "chunks",
     [](W& w) {
       auto r = w.ReserveReq();
       r.clear_chunks();
       return w.Do(r);
     }},
    {"ReserveTooManyChunks", kInvalid, "chunks",
     [](W& w) { return w.Do(w.ReserveRequest(Tokens(36, 900), w.session_)); }},
    {"ReserveUnknownSession", kPrecondition, "session_id",
     [](W& w) {
       auto r = w.ReserveReq();
       r.set_session_id(4242);
       return w.Do(r);
     }},
    {"ReserveStaleEpoch", kPrecondition, "epoch",
     [](W& w) {
       auto r = w.ReserveReq();
       r.set_epoch(7);
       return w.Do(r);
     }},
    {"ReserveNamespaceIdNot16Bytes", kInvalid, "namespace_id",
     [](W& w) {
       auto r = w.ReserveReq();
       r.set_namespace_id(Bytes(17));
       return w.Do(r);
     }},
    {"ReserveUnknownNamespace", StatusCode::kNotFound, "namespace_id",
     [](W& w) {
       auto r = w.ReserveReq();
       r.set_namespace_id(Bytes(16));
       return w.Do(r);
     }},
    {"ReserveKeyNot16Bytes", kInvalid, "chunks[0].key",
     [](W& w) {
       auto r = w.ReserveReq();
       r.mutable_chunks(0)->set_key(Bytes(8));
       return w.Do(r);
     }},
    {"ReserveParentKeyNot16Bytes", kInvalid, "chunks[0].parent_key",
     [](W& w) {
       auto r = w.ReserveReq();
       r.mutable_chunks(0)->set_parent_key("");
       return w.Do(r);
     }},
    {"ReserveTokensTooShort", kInvalid, "chunks[2].tokens",
     [](W& w) {
       auto r = w.ReserveReq();
       r.mutable_chunks(2)->set_tokens(PackTokens(Tokens(3)));
       return w.Do(r);
     }},
    {"ReserveTokensNotWholeIds", kInvalid, "chunks[0].tokens",
     [](W& w) {
       auto r = w.ReserveReq();
       r.mutable_chunks(0)->mutable_tokens()->push_back('x');
       return w.Do(r);
     }},
    {"ReserveParentNotPreviousKey", kInvalid, "chunks[1].parent_key",
     [](W& w) {
       auto r = w.ReserveReq();
       r.mutable_chunks(1)->set_parent_key(w.ns_.ToBytes());
       return w.Do(r);
     }},
    {"ReserveKeyNotHashOfParentAndTokens", kInvalid, "chunks[2].key",
     [](W& w) {
       auto r = w.ReserveReq();
       r.mutable_chunks(2)->set_tokens(PackTokens(Tokens(4, 7)));  // key stays the old one
       return w.Do(r);
     }},
    {"ReserveForgedChunkZeroKey", kInvalid, "chunks[0].key",
     [](W& w) {
       auto r = w.ReserveReq();
       (*r.mutable_chunks(0)->mutable_key())[0] ^= 1;
       return w.Do(r);
     }},
    // ---- ReleaseRead ----
    {"ReleaseUnknownLease", StatusCode::kNotFound, "lease_id",
     [](W& w) { return w.Release(987654); }},
    {"ReleaseForeignLease", StatusCode::kPermissionDenied, "lease_id",
     [](W& w) { return w.Release(w.lease_, w.b_); }},
    {"ReleaseUnknownSession", kPrecondition, "session_id",
     [](W& w) { return w.Release(w.lease_, 4242); }},
    // ---- CommitWrite / AbortWrite ----
    {"CommitUnknownReservation", StatusCode::kNotFound, "reservation_id",
     [](W& w) { return w.Commit(w.session_, 987654); }},
    {"CommitForeignReservation", StatusCode::kPermissionDenied, "reservation_id",
     [](W& w) { return w.Commit(w.b_, w.reservation_); }},
    {"CommitUnknownSession", kPrecondition, "session_id",
     [](W& w) { return w.Commit(4242, w.reservation_); }},
    {"AbortUnknownReservation", StatusCode::kNotFound, "reservation_id",
     [](W& w) { return w.Abort(w.session_, 987654); }},
    {"AbortForeignReservation", StatusCode::kPermissionDenied, "reservation_id",
     [](W& w) { return w.Abort(w.b_, w.reservation_); }},
    {"AbortUnknownSession", kPrecondition, "session_id",
     [](W& w) { return w.Abort(4242, w.reservation_); }},
    // ---- OpenNamespace ----
    {"OpenMissingSpec", kInvalid, "spec",
     [](W& w) {
       v1::OpenNamespaceRequest r;
       r.set_session_id(w.session_);
       v1::OpenNamespaceResponse resp;
       return wire::Run(*w.core_, r, &resp);
     }},
    {"OpenEmptyModel", kInvalid, "model_id",
     [](W& w) { return w.Open([](auto& s) { s.set_model_id(""); }); }},
    {"OpenBadDtype", kInvalid, "kv_dtype",
     [](W& w) { return w.Open([](auto& s) { s.set_kv_dtype("fp64"); }); }},
    {"OpenBadLayout", kInvalid, "layout",
     [](W& w) { return w.Open([](auto& s) { s.set_layout("paged"); }); }},
    {"OpenZeroLayers", kInvalid, "num_layers",
     [](W& w) { return w.Open([](auto& s) { s.set_num_layers(0); }); }},
    {"OpenZeroKvHeads", kInvalid, "num_kv_heads",
     [](W& w) { return w.Open([](auto& s) { s.set_num_kv_heads(0); }); }},
    {"OpenZeroHeadDim", kInvalid, "head_dim",
     [](W& w) { return w.Open([](auto& s) { s.set_head_dim(0); }); }},
    {"OpenLatentDimWithMha", kInvalid, "latent_dim",
     [](W& w) { return w.Open([](auto& s) { s.set_latent_dim(512); }); }},
    {"OpenZeroChunkTokens", kInvalid, "chunk_tokens",
     [](W& w) { return w.Open([](auto& s) { s.set_chunk_tokens(0); }); }},
    {"OpenZeroTpSize", kInvalid, "tp_size",
     [](W& w) { return w.Open([](auto& s) { s.set_tp_size(0); }); }},
    {"OpenTpRankNotBelowTpSize", kInvalid, "tp_rank",
     [](W& w) { return w.Open([](auto& s) { s.set_tp_rank(1); }); }},
    {"OpenSaltWithSeparator", kInvalid, "cache_salt",
     [](W& w) { return w.Open([](auto& s) { s.set_cache_salt("a|b"); }); }},
    {"OpenSlotLargerThanArena", kInvalid, "spec",
     [](W& w) { return w.Open([](auto& s) { s.set_chunk_tokens(256); }); }},
    {"OpenUnknownSession", kPrecondition, "session_id",
     [](W& w) { return w.Open([](auto&) {}, 4242); }},
    {"OpenBeyondMaxNamespaces", StatusCode::kResourceExhausted, "namespaces",
     [](W& w) { return w.Open([](auto&) {}); }},
};

class RequestValidation : public ::testing::TestWithParam<Row> {};

TEST_P(RequestValidation, IsRejectedNamingTheFieldAndChangesNothing) {
  const Row& row = GetParam();
  W w;
  w.Build();
  if (HasFatalFailure()) return;
  const std::string before = w.Snapshot();
  const uint64_t used_before = w.UsedBytes();
  const Status st = row.run(w);
  EXPECT_EQ(st.code(), row.code) << st.ToString();
  EXPECT_NE(st.message().find(row.field), std::string::npos)
      << "message does not name '" << row.field << "': " << st.message();
  EXPECT_EQ(w.UsedBytes(), used_before);
  EXPECT_EQ(w.Snapshot(), before);
  // The world still works: A's lease and reservation are intact and usable.
  EXPECT_TRUE(w.Release(w.lease_).ok());
  EXPECT_TRUE(w.Commit(w.session_, w.reservation_).ok());
  EXPECT_EQ(w.Lookup(w.stored_, false).num_chunks(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Rows, RequestValidation, ::testing::ValuesIn(kRows),
                         [](const ::testing::TestParamInfo<Row>& info) {
                           return std::string(info.param.name);
                         });

TEST(RequestValidationTable, ValidRequestsOfTheTableAreAccepted) {
  W w;
  w.Build();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_TRUE(w.Do(w.LookupReq()).ok());
  EXPECT_TRUE(w.Do(w.ReserveReq()).ok());
  EXPECT_TRUE(w.Open([](auto& s) { s.set_model_id("test-model"); }).ok());  // reopen is fine
}

}  // namespace
}  // namespace kvtier::testing
