// kvtierd's /metrics text (PrometheusText) over a real CacheCore: counters
// that only grow, tokens by model with a bound on labels, prefetch outcomes.
// The scrape against a running kvtierd, parsed by prometheus_client, is
// client/python/tests/test_metrics.py.
#include "kvtier/daemon/metrics.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>

#include "daemon/cache_core_harness.h"

namespace kvtier::testing {
namespace {

// One scrape: "name{labels}" -> value, and the names whose family is a counter.
struct Scrape {
  std::map<std::string, double> samples;
  std::set<std::string> counters;

  double at(const std::string& series) const {
    auto it = samples.find(series);
    EXPECT_NE(it, samples.end()) << series;
    return it == samples.end() ? -1 : it->second;
  }
};

class MetricsTest : public CacheCoreHarness {
 protected:
  Scrape Render() const {
    Scrape s;
    std::istringstream in(PrometheusText(core_->Stats(), core_->ReadLatencies()));
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("# TYPE ", 0) == 0) {
        const size_t sp = line.find(' ', 7);
        if (line.substr(sp + 1) == "counter") s.counters.insert(line.substr(7, sp - 7));
        continue;
      }
      if (line.empty() || line[0] == '#') continue;
      const size_t sp = line.rfind(' ');
      EXPECT_TRUE(s.samples.emplace(line.substr(0, sp), std::stod(line.substr(sp + 1))).second)
          << "twice: " << line;
    }
    return s;
  }

  // Every counter series of `before` is in `after`, not lower.
  static void ExpectNoCounterWentDown(const Scrape& before, const Scrape& after, const char* step) {
    for (const auto& [series, value] : before.samples) {
      const std::string family = series.substr(0, series.find('{'));
      if (!before.counters.count(family)) continue;
      auto it = after.samples.find(series);
      ASSERT_NE(it, after.samples.end()) << step << ": " << series << " is gone";
      EXPECT_GE(it->second, value) << step << ": " << series << " went down";
    }
  }

  // Opens a namespace of `model_id` (the harness's spec otherwise) and makes
  // it the one Lookup and Prefetch use.
  void UseModel(const std::string& model_id) {
    v1::OpenNamespaceRequest req;
    req.set_session_id(session_);
    *req.mutable_spec() = TinyProtoSpec();
    req.mutable_spec()->set_model_id(model_id);
    v1::OpenNamespaceResponse resp;
    ASSERT_TRUE(wire::Run(*core_, req, &resp).ok()) << model_id;
    ns_wire_ = resp.namespace_id();
  }
};

// A Prometheus counter that goes down reads as a restart: rate() then adds the
// whole counter again. Two did: a lease whose client never got the answer
// took its hits and bytes back, and dram misses fell when a later lookup of the
// same request served them.
TEST_F(MetricsTest, EveryCounterOnlyGrows) {
  const Scrape start = Render();
  request_id = "cmpl-1";
  EXPECT_EQ(Lookup(Tokens(12), /*acquire=*/true).num_chunks(), 0u);  // 3 chunks missed
  const Scrape missed = Render();
  ExpectNoCounterWentDown(start, missed, "miss");
  EXPECT_EQ(missed.at("kvtier_tier_misses{tier=\"dram\"}"), 3);

  ASSERT_EQ(Store(Tokens(12)), 3u);
  const v1::LookupResponse served = Lookup(Tokens(12), true);  // the same request, now served
  ASSERT_EQ(served.num_chunks(), 3u);
  ASSERT_TRUE(Release(served.lease_id()).ok());
  const Scrape hit = Render();
  ExpectNoCounterWentDown(missed, hit, "served later");
  EXPECT_EQ(hit.at("kvtier_tier_misses{tier=\"dram\"}"), 0);

  request_id = "cmpl-2";  // leased, but its client gave up before the answer
  const v1::LookupResponse lost = Lookup(Tokens(12), true);
  ASSERT_EQ(lost.num_chunks(), 3u);
  const Scrape leased = Render();  // a scrape while the lease is held
  ExpectNoCounterWentDown(hit, leased, "leased");
  ASSERT_TRUE(core_->ReleaseUnserved(session_, lost.lease_id()).ok());
  const Scrape unserved = Render();
  ExpectNoCounterWentDown(leased, unserved, "unserved");

  // Two requests of 12 tokens; 3 chunks served (cmpl-1), 3 leased and not served (cmpl-2).
  EXPECT_EQ(unserved.at("kvtier_lookup_tokens_total"), 24);
  EXPECT_EQ(unserved.at("kvtier_lookup_chunks_total"), 6);
  EXPECT_EQ(unserved.at("kvtier_hit_tokens_total"), 24);
  EXPECT_EQ(unserved.at("kvtier_unserved_hit_tokens_total"), 12);
  EXPECT_EQ(unserved.at("kvtier_tier_hits_total{tier=\"dram\"}"), 6);
  EXPECT_EQ(unserved.at("kvtier_tier_unserved_hits_total{tier=\"dram\"}"), 3);
  EXPECT_EQ(unserved.at("kvtier_tier_read_bytes_total{tier=\"dram\"}"), 6 * kPayloadBytes);
  EXPECT_EQ(unserved.at("kvtier_tier_unserved_read_bytes_total{tier=\"dram\"}"), 3 * kPayloadBytes);
  EXPECT_EQ(unserved.at("kvtier_tier_misses{tier=\"dram\"}"), 3) << "cmpl-2's chunks";
  // kvtierctl stats shows what was served: the counters less the unserved ones.
  const v1::StatsResponse s = Stats();
  EXPECT_EQ(s.hit_tokens(), 12u);
  EXPECT_EQ(s.unserved_hit_tokens(), 12u);
  EXPECT_EQ(s.tiers(0).hits(), 3u);
  EXPECT_EQ(s.tiers(0).unserved_hits(), 3u);
  EXPECT_EQ(s.tiers(0).read_bytes(), 3 * kPayloadBytes);
}

TEST_F(MetricsTest, TokensAreCountedByModelUnderABoundedNumberOfLabels) {
  ASSERT_EQ(Store(Tokens(8)), 2u);  // in the harness's namespace, model "test-model"
  const v1::LookupResponse leased = Lookup(Tokens(12), true);  // 8 of 12 tokens hit
  ASSERT_EQ(leased.num_chunks(), 2u);
  ASSERT_TRUE(Release(leased.lease_id()).ok());
  const size_t others = core::kMaxModelLabels + 2;  // two past the bound
  for (size_t m = 0; m < others; ++m) {
    UseModel("model-" + std::to_string(m));
    EXPECT_EQ(Lookup(Tokens(4 + m % 2), true).num_chunks(), 0u);
  }
  const v1::StatsResponse s = Stats();
  ASSERT_EQ(s.models_size(), int(core::kMaxModelLabels) + 1);
  EXPECT_EQ(s.models(0).model_id(), "test-model");
  EXPECT_EQ(s.models(0).lookup_tokens(), 12u);
  EXPECT_EQ(s.models(0).hit_tokens().dram(), 8u);
  EXPECT_EQ(s.models(1).model_id(), "model-0");
  EXPECT_EQ(s.models(1).lookup_tokens(), 4u);
  EXPECT_EQ(s.models(1).hit_tokens().dram(), 0u);
  // model-63 .. model-65 are past the 64th label: counted together.
  const v1::ModelStats& other = s.models(s.models_size() - 1);
  EXPECT_EQ(other.model_id(), "_other");
  EXPECT_EQ(other.lookup_tokens(), 5u + 4u + 5u);

  const Scrape scrape = Render();
  EXPECT_EQ(scrape.at("kvtier_model_lookup_tokens_total{model=\"test-model\"}"), 12);
  EXPECT_EQ(scrape.at("kvtier_model_hit_tokens_total{model=\"test-model\",tier=\"dram\"}"), 8);
  EXPECT_EQ(scrape.at("kvtier_model_lookup_tokens_total{model=\"_other\"}"), 14);
  size_t labelled = 0;
  for (const auto& [series, value] : scrape.samples) {
    labelled += series.rfind("kvtier_model_lookup_tokens_total{", 0) == 0;
  }
  EXPECT_EQ(labelled, core::kMaxModelLabels + 1);
}

// A model id is a client's text: a quote or backslash in it must not end
// the label early (the text format escapes both).
TEST_F(MetricsTest, AModelIdIsEscapedInItsLabel) {
  UseModel(R"(org/"quoted"\model)");
  EXPECT_EQ(Lookup(Tokens(4), true).num_chunks(), 0u);
  const Scrape scrape = Render();
  EXPECT_EQ(scrape.at(R"(kvtier_model_lookup_tokens_total{model="org/\"quoted\"\\model"})"), 4);
}

TEST_F(MetricsTest, PrefetchOutcomesAreCountedOnceEach) {
  v1::PrefetchResponse p;
  ASSERT_TRUE(Prefetch(Tokens(8, 1000), &p).ok());  // nothing cached
  EXPECT_EQ(p.ticket(), 0u);

  ASSERT_EQ(Store(Tokens(8)), 2u);
  ASSERT_TRUE(Prefetch(Tokens(8), &p).ok());  // in DRAM: done at once
  ASSERT_NE(p.ticket(), 0u);
  const v1::LookupResponse used = LookupWithTicket(Tokens(8), p.ticket());
  ASSERT_EQ(used.num_chunks(), 2u);
  ASSERT_TRUE(Release(used.lease_id()).ok());

  ASSERT_TRUE(Prefetch(Tokens(8), &p, /*deadline_ms=*/100).ok());
  ASSERT_NE(p.ticket(), 0u);
  clock_.Advance(std::chrono::milliseconds(101));
  core_->ExpireNow();

  const uint64_t other = core_->OpenSession("other", ExitedPid());
  ASSERT_TRUE(Prefetch(Tokens(8), &p, 0, 0, other).ok());
  ASSERT_NE(p.ticket(), 0u);
  core_->EndSession(other);

  // Tickets may hold half the 16-slot arena: four of 2 chunks, then none.
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(Prefetch(Tokens(8), &p).ok());
    ASSERT_NE(p.ticket(), 0u) << i;
  }
  ASSERT_TRUE(Prefetch(Tokens(8), &p).ok());
  EXPECT_EQ(p.ticket(), 0u);

  const v1::PrefetchOutcomes o = Stats().prefetches();
  EXPECT_EQ(o.nothing_cached(), 1u);
  EXPECT_EQ(o.used(), 1u);
  EXPECT_EQ(o.used_early(), 0u);
  EXPECT_EQ(o.expired(), 1u);
  EXPECT_EQ(o.session_ended(), 1u);
  EXPECT_EQ(o.over_budget(), 1u);
  const Scrape scrape = Render();
  for (const char* outcome :
       {"nothing_cached", "used", "expired", "session_ended", "over_budget"}) {
    EXPECT_EQ(scrape.at(std::string("kvtier_prefetches_total{outcome=\"") + outcome + "\"}"), 1)
        << outcome;
  }
  EXPECT_EQ(scrape.at("kvtier_prefetches_total{outcome=\"used_early\"}"), 0);
}

}  // namespace
}  // namespace kvtier::testing
