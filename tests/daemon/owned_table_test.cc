// OwnedTable: grants bound to the session that made them.
#include "kvtier/daemon/owned_table.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace kvtier {
namespace {

struct Grant {
  uint64_t session_id = 0;
  Clock::TimePoint expiry;
  int payload = 0;
};

Clock::TimePoint At(int ms) { return Clock::TimePoint(std::chrono::milliseconds(ms)); }

std::vector<int> Payloads(const std::vector<Grant>& grants) {
  std::vector<int> p;
  for (const Grant& g : grants) p.push_back(g.payload);
  std::sort(p.begin(), p.end());
  return p;
}

TEST(OwnedTableTest, AnotherSessionsIdIsRefusedAndLeftInPlace) {
  OwnedTable<Grant> t("lease_id", "released or expired");
  t.Add(7, {.session_id = 1, .expiry = At(100), .payload = 70});
  auto stolen = t.Take(7, /*session_id=*/2);
  ASSERT_FALSE(stolen.ok());
  EXPECT_EQ(stolen.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(stolen.status().message().find("lease_id 7"), std::string::npos);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_TRUE(t.TakeSession(2).empty());  // nor does ending that session take it

  auto mine = t.Take(7, 1);
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->payload, 70);
  EXPECT_EQ(t.size(), 0u);
  auto again = t.Take(7, 1);
  EXPECT_EQ(again.status().code(), StatusCode::kNotFound);
  EXPECT_NE(again.status().message().find("released or expired"), std::string::npos);
}

TEST(OwnedTableTest, EndingASessionTakesItsGrantsOnly) {
  OwnedTable<Grant> t("lease_id", "gone");
  t.Add(1, {.session_id = 1, .expiry = At(100), .payload = 10});
  t.Add(2, {.session_id = 2, .expiry = At(100), .payload = 20});
  t.Add(3, {.session_id = 1, .expiry = At(100), .payload = 30});
  EXPECT_EQ(Payloads(t.TakeSession(1)), (std::vector<int>{10, 30}));
  EXPECT_EQ(t.size(), 1u);
  EXPECT_TRUE(t.TakeSession(1).empty());
  ASSERT_TRUE(t.Take(2, 2).ok());
}

TEST(OwnedTableTest, ExpiryTakesWhatIsDueAndForgetsItsSession) {
  OwnedTable<Grant> t("reservation_id", "gone");
  t.Add(1, {.session_id = 1, .expiry = At(50), .payload = 10});
  t.Add(2, {.session_id = 1, .expiry = At(100), .payload = 20});
  t.Add(3, {.session_id = 2, .expiry = At(150), .payload = 30});
  EXPECT_TRUE(t.TakeExpired(At(49)).empty());
  EXPECT_EQ(Payloads(t.TakeExpired(At(100))), (std::vector<int>{10, 20}));
  EXPECT_TRUE(t.TakeSession(1).empty());  // its expired grants are not taken twice
  EXPECT_EQ(Payloads(t.TakeSession(2)), (std::vector<int>{30}));
  EXPECT_EQ(t.size(), 0u);
}

}  // namespace
}  // namespace kvtier
