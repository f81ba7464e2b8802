#include "redis_protocol.h"

#include <charconv>
#include <string>

namespace kvtier::redis {
namespace {

std::string_view Text(const redisReply& r) {
  return r.str != nullptr ? std::string_view(r.str, r.len) : std::string_view();
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

Status Bad(size_t entry, const std::string& what) {
  return Status::InvalidArgument("CLUSTER SLOTS entry " + std::to_string(entry) + ": " + what);
}

// The master of one CLUSTER SLOTS entry: [host, port, id, ...].
Result<RedisEndpoint> ParseSlotsNode(const redisReply& node, size_t entry,
                                     const RedisEndpoint& from) {
  if (node.type != REDIS_REPLY_ARRAY || node.elements < 2 || node.element == nullptr ||
      node.element[0] == nullptr || node.element[1] == nullptr) {
    return Bad(entry, "the master is not an array of host and port");
  }
  const redisReply& host = *node.element[0];
  const redisReply& port = *node.element[1];
  if (host.type != REDIS_REPLY_STRING) return Bad(entry, "the master's host is not a string");
  if (port.type != REDIS_REPLY_INTEGER || port.integer < 1 || port.integer > 65535) {
    return Bad(entry, "the master's port is not an integer in 1..65535");
  }
  RedisEndpoint ep;
  const std::string_view h = Text(host);
  ep.host = h.empty() || h == "?" ? from.host : std::string(h);
  ep.port = static_cast<uint16_t>(port.integer);
  return ep;
}

}  // namespace

Result<uint16_t> ParsePort(std::string_view text) {
  unsigned value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < 1 || value > 65535) {
    return Status::InvalidArgument("port '" + std::string(text) + "' is not a number in 1..65535");
  }
  return static_cast<uint16_t>(value);
}

Result<RedisEndpoint> ParseHostPort(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    return Status::InvalidArgument("'" + std::string(text) + "' is not host:port");
  }
  auto port = ParsePort(text.substr(colon + 1));
  if (!port.ok()) return port.status();
  std::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return RedisEndpoint{std::string(host), *port};
}

Result<std::vector<SlotRange>> ParseClusterSlots(const redisReply& reply,
                                                 const RedisEndpoint& from) {
  if (reply.type != REDIS_REPLY_ARRAY) {
    return Status::InvalidArgument("CLUSTER SLOTS answer is not an array");
  }
  std::vector<SlotRange> ranges;
  for (size_t i = 0; i < reply.elements; ++i) {
    const redisReply* e = reply.element != nullptr ? reply.element[i] : nullptr;
    if (e == nullptr || e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element == nullptr ||
        e->element[0] == nullptr || e->element[1] == nullptr || e->element[2] == nullptr) {
      return Bad(i, "not an array of first slot, last slot and master");
    }
    const redisReply& first = *e->element[0];
    const redisReply& last = *e->element[1];
    if (first.type != REDIS_REPLY_INTEGER || last.type != REDIS_REPLY_INTEGER ||
        first.integer < 0 || last.integer < first.integer || last.integer >= kNumSlots) {
      return Bad(i, "slots are not integers first <= last in 0..16383");
    }
    auto master = ParseSlotsNode(*e->element[2], i, from);
    if (!master.ok()) return master.status();
    ranges.push_back(SlotRange{static_cast<uint16_t>(first.integer),
                               static_cast<uint16_t>(last.integer), std::move(master).value()});
  }
  return ranges;
}

bool IsRedirect(std::string_view error) {
  return StartsWith(error, "MOVED ") || StartsWith(error, "ASK ");
}

Result<Redirect> ParseRedirect(std::string_view error, const RedisEndpoint& from) {
  Redirect r;
  r.ask = StartsWith(error, "ASK ");
  std::string_view rest = error.substr(r.ask ? 4 : 6);
  const size_t space = rest.find(' ');
  if (!IsRedirect(error) || space == std::string_view::npos) {
    return Status::InvalidArgument("not 'MOVED|ASK <slot> <host>:<port>'");
  }
  const std::string_view slot = rest.substr(0, space);
  unsigned value = 0;
  auto [ptr, ec] = std::from_chars(slot.data(), slot.data() + slot.size(), value);
  if (slot.empty() || ec != std::errc() || ptr != slot.data() + slot.size() || value >= kNumSlots) {
    return Status::InvalidArgument("slot '" + std::string(slot) + "' is not in 0..16383");
  }
  r.slot = static_cast<uint16_t>(value);
  auto target = ParseHostPort(rest.substr(space + 1));
  if (!target.ok()) return target.status();
  r.target = std::move(target).value();
  if (r.target.host.empty()) r.target.host = from.host;
  return r;
}

bool IsClusterDisabled(std::string_view error) {
  return error.find("cluster support disabled") != std::string_view::npos ||
         StartsWith(error, "ERR unknown command");
}

}  // namespace kvtier::redis
