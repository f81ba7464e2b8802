#include "kvtier/tools/trace.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvtier/tools/synthetic_kv.h"

namespace kvtier::tools {

Result<std::vector<TraceRequest>> LoadMooncakeTrace(const std::string& path, uint64_t limit) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("trace file " + path + " cannot be opened");
  return ParseMooncakeTrace(in, path, limit);
}

Result<std::vector<TraceRequest>> ParseMooncakeTrace(std::istream& in, const std::string& path,
                                                     uint64_t limit) {
  std::vector<TraceRequest> out;
  std::string line;
  uint64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    // nlohmann keeps the last of a key given twice; a trace line that does so is
    // ambiguous, so the parser callback notes the first repeated key.
    std::vector<std::set<std::string>> open_objects;
    std::string repeated;
    const auto note_repeats = [&](int /*depth*/, nlohmann::json::parse_event_t event,
                                  nlohmann::json& parsed) {
      using Event = nlohmann::json::parse_event_t;
      if (event == Event::object_start) {
        open_objects.emplace_back();
      } else if (event == Event::object_end && !open_objects.empty()) {
        open_objects.pop_back();
      } else if (event == Event::key && !open_objects.empty() && repeated.empty() &&
                 !open_objects.back().insert(parsed.get<std::string>()).second) {
        repeated = parsed.get<std::string>();
      }
      return true;
    };
    nlohmann::json j = nlohmann::json::parse(line, note_repeats, /*allow_exceptions=*/false);
    if (j.is_discarded()) return Status::InvalidArgument(where + "not valid JSON");
    if (!repeated.empty()) {
      return Status::InvalidArgument(where + "key '" + repeated + "' appears twice");
    }
    if (!j.is_object()) return Status::InvalidArgument(where + "not a JSON object");
    TraceRequest r;
    for (const char* f : {"timestamp", "input_length", "output_length", "hash_ids"}) {
      if (!j.contains(f)) return Status::InvalidArgument(where + "field '" + f + "' is missing");
    }
    if (!j["timestamp"].is_number()) {
      return Status::InvalidArgument(where + "field 'timestamp' is not a number");
    }
    for (const char* f : {"input_length", "output_length"}) {
      if (!j[f].is_number_integer() || j[f].get<int64_t>() < 0) {
        return Status::InvalidArgument(where + "field '" + f + "' is not a non-negative integer");
      }
    }
    if (!j["hash_ids"].is_array()) {
      return Status::InvalidArgument(where + "field 'hash_ids' is not an array");
    }
    r.timestamp_ms = j["timestamp"].get<double>();
    r.input_length = j["input_length"].get<uint64_t>();
    if (r.input_length > kMaxTraceInputTokens) {
      return Status::InvalidArgument(where + "input_length " + std::to_string(r.input_length) +
                                     " exceeds " + std::to_string(kMaxTraceInputTokens) +
                                     " tokens (kvtierd's longest prompt)");
    }
    r.output_length = j["output_length"].get<uint64_t>();
    for (const auto& id : j["hash_ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) {
        return Status::InvalidArgument(where +
                                       "hash_ids holds a value that is not a "
                                       "non-negative integer");
      }
      r.hash_ids.push_back(id.get<uint64_t>());
    }
    const uint64_t want = (r.input_length + kTraceBlockTokens - 1) / kTraceBlockTokens;
    if (r.hash_ids.size() != want) {
      return Status::InvalidArgument(where + "hash_ids has " + std::to_string(r.hash_ids.size()) +
                                     " ids, but input_length " + std::to_string(r.input_length) +
                                     " needs " + std::to_string(want) + " blocks of 512 tokens");
    }
    out.push_back(std::move(r));
    if (limit != 0 && out.size() >= limit) break;
  }
  return out;
}

std::vector<TraceRequest> GenerateMultiTurnTrace(uint64_t num_requests, uint64_t seed) {
  std::mt19937_64 rng(seed);
  constexpr uint64_t kSystemBlock = 0;  // shared system prompt, like id 0 in the real trace
  uint64_t next_id = 1;
  struct Conversation {
    std::vector<uint64_t> blocks;
    uint64_t length = 0;
  };
  std::vector<Conversation> live;
  std::vector<TraceRequest> out;
  double t = 0;
  while (out.size() < num_requests) {
    t += std::uniform_real_distribution<double>(0, 600)(rng);
    const bool new_conversation = live.size() < 8 || rng() % 4 == 0;
    if (new_conversation) {
      Conversation c;
      c.blocks.push_back(kSystemBlock);
      c.length = 512;
      live.push_back(c);
    }
    Conversation& c = live[new_conversation ? live.size() - 1 : rng() % live.size()];
    // A turn adds 200..3000 tokens (user message + previous answer).
    uint64_t add = 200 + rng() % 2800;
    uint64_t target = c.length + add;
    // The old partial tail block is replaced by a full one plus new blocks.
    if (c.length % 512 != 0) c.blocks.back() = next_id++;
    while (c.blocks.size() * 512 < target) c.blocks.push_back(next_id++);
    c.length = target;
    TraceRequest r;
    r.timestamp_ms = t;
    r.input_length = target;
    r.output_length = 200;
    r.hash_ids = c.blocks;
    out.push_back(r);
    if (c.length > 60000) live.erase(live.begin() + (&c - live.data()));
  }
  return out;
}

}  // namespace kvtier::tools
