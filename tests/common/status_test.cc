// Status and Result<T>: the Result checks hold in every build type (Release included).
#include "kvtier/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

#include "common/status_printer.h"

namespace kvtier {
namespace {

class ResultDeathTest : public ::testing::Test {
 protected:
  // The test binaries may run threads (gRPC, sanitizers): re-execute instead of a bare fork.
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

Result<int> Failing() { return Status::NotFound("no chunk 7"); }

TEST(ResultTest, AValueResultGivesItsValueAndAnOkStatus) {
  Result<std::string> r(std::string("kv"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOk);
  EXPECT_EQ(*r, "kv");
  EXPECT_EQ(r->size(), 2u);
  EXPECT_EQ(std::move(r).value(), "kv");
}

TEST(ResultTest, AnErrorResultKeepsItsStatus) {
  Result<int> r = Failing();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "no chunk 7");
}

TEST(ResultTest, AMoveOnlyValueMovesOut) {
  Result<std::unique_ptr<int>> r(std::make_unique<int>(5));
  std::unique_ptr<int> p = std::move(r).value();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 5);
}

// On the old code (assert, then std::get) a Release build let the OK Status through, and
// reading the value threw std::bad_variant_access instead of naming the Status.
TEST_F(ResultDeathTest, ReadingTheValueOfAnErrorResultAbortsNamingTheStatus) {
  EXPECT_DEATH(
      {
        Result<int> r = Failing();
        (void)r.value();
      },
      "kvtier: value of an error Result \\(NOT_FOUND: no chunk 7\\)");
  EXPECT_DEATH(
      {
        const Result<std::string> r = Status::Internal("broken index");
        (void)r->size();
      },
      "value of an error Result \\(INTERNAL: broken index\\)");
  EXPECT_DEATH(
      {
        Result<std::string> r = Status::Unavailable("down");
        std::string s = *std::move(r);
      },
      "value of an error Result \\(UNAVAILABLE: down\\)");
}

TEST_F(ResultDeathTest, BuildingAResultFromAnOkStatusAborts) {
  EXPECT_DEATH({ Result<int> r(Status::Ok()); }, "kvtier: Result built from an OK Status");
}

}  // namespace
}  // namespace kvtier
