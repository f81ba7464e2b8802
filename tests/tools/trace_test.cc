// Mooncake trace reading: every malformed line is an error naming file:line.
#include "kvtier/tools/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace kvtier::tools {
namespace {

class TraceFile {
 public:
  explicit TraceFile(const std::string& text) {
    char name[] = "/tmp/kvtier-trace-XXXXXX";
    const int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    close(fd);
    path_ = name;
    std::ofstream(path_) << text;
  }
  ~TraceFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const char* kGood =
    R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]})";

TEST(MooncakeTrace, ReadsFieldsAndSkipsBlankLines) {
  TraceFile f(std::string(kGood) + "\n\n" + kGood + "\n");
  auto t = LoadMooncakeTrace(f.path(), 0);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].input_length, 600u);
  EXPECT_EQ((*t)[0].output_length, 5u);
  EXPECT_EQ((*t)[0].hash_ids, (std::vector<uint64_t>{0, 1}));
}

TEST(MooncakeTrace, LimitStopsEarly) {
  TraceFile f(std::string(kGood) + "\n" + kGood + "\n" + "not json\n");
  auto t = LoadMooncakeTrace(f.path(), 2);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->size(), 2u);
}

TEST(MooncakeTrace, MissingFileIsNotFound) {
  auto t = LoadMooncakeTrace("/nonexistent/trace.jsonl", 0);
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
}

struct BadLine {
  const char* line;
  const char* names;
};

class MalformedLine : public ::testing::TestWithParam<BadLine> {};

TEST_P(MalformedLine, IsAnErrorNamingFileLineAndProblem) {
  TraceFile f(std::string(kGood) + "\n" + kGood + "\n" + GetParam().line + "\n");
  auto t = LoadMooncakeTrace(f.path(), 0);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find(f.path() + ":3:"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find(GetParam().names), std::string::npos) << t.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Rows, MalformedLine,
    ::testing::Values(
        BadLine{"{not json", "not valid JSON"}, BadLine{"[1, 2]", "not a JSON object"},
        BadLine{R"({"input_length": 1, "output_length": 1, "hash_ids": [0]})", "timestamp"},
        BadLine{R"({"timestamp": "x", "input_length": 1, "output_length": 1, "hash_ids": [0]})",
                "timestamp"},
        BadLine{R"({"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []})",
                "input_length"},
        BadLine{R"({"timestamp": 0, "input_length": 1.5, "output_length": 1, "hash_ids": [0]})",
                "input_length"},
        BadLine{R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": 7})",
                "hash_ids"},
        BadLine{R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-3]})",
                "hash_ids"},
        BadLine{R"({"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [0, 1]})",
                "needs 3 blocks"},
        BadLine{R"({"timestamp": 0, "input_length": 9999999, "output_length": 1, "hash_ids": [0]})",
                "exceeds"},
        // A review found a key given twice taking the last value without a word.
        BadLine{R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0],)"
                R"( "input_length": 600})",
                "key 'input_length' appears twice"}));

TEST(MultiTurnGenerator, IsDeterministicAndTurnsExtendTheirConversation) {
  const auto a = GenerateMultiTurnTrace(200, 7);
  const auto b = GenerateMultiTurnTrace(200, 7);
  ASSERT_EQ(a.size(), 200u);
  size_t shared_prefixes = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].hash_ids, b[i].hash_ids);
    EXPECT_EQ(a[i].hash_ids.size(), (a[i].input_length + 511) / 512) << "request " << i;
    EXPECT_EQ(a[i].hash_ids.front(), 0u) << "every conversation starts with the system block";
    for (size_t j = 0; j < i; ++j) {
      if (a[j].hash_ids.size() > 1 && a[i].hash_ids.size() > a[j].hash_ids.size() &&
          std::equal(a[j].hash_ids.begin(), a[j].hash_ids.end() - 1, a[i].hash_ids.begin())) {
        ++shared_prefixes;
        break;
      }
    }
  }
  EXPECT_GT(shared_prefixes, 50u) << "later turns should reuse earlier turns' full blocks";
}

}  // namespace
}  // namespace kvtier::tools
