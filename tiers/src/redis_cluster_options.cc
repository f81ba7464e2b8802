// RedisEndpoint, ParseRedisUrl, RedisClusterOptions::Validate and RedisCluster::KeySlot:
// the parts of redis_cluster.h that need no connection.
#include <string>

#include "kvtier/tiers/redis_cluster.h"
#include "redis_protocol.h"

namespace kvtier {

std::string RedisEndpoint::ToString() const {
  const std::string p = std::to_string(port);
  return host.find(':') != std::string::npos ? "[" + host + "]:" + p : host + ":" + p;
}

namespace {

constexpr std::string_view kScheme = "redis://";

Result<RedisEndpoint> ParseUrlHost(std::string_view item) {
  if (item.empty()) return Status::InvalidArgument("empty host");
  RedisEndpoint ep;
  std::string_view port;
  if (item.front() == '[') {
    const size_t close = item.find(']');
    if (close == std::string_view::npos) {
      return Status::InvalidArgument("'" + std::string(item) + "': no ']' after an IPv6 address");
    }
    ep.host = std::string(item.substr(1, close - 1));
    const std::string_view after = item.substr(close + 1);
    if (!after.empty() && after.front() != ':') {
      return Status::InvalidArgument("'" + std::string(item) + "': ':' must follow ']'");
    }
    if (!after.empty()) port = after.substr(1);
    if (!after.empty() && port.empty()) return Status::InvalidArgument("empty port");
  } else {
    const size_t colon = item.find(':');
    if (colon != std::string_view::npos && item.find(':', colon + 1) != std::string_view::npos) {
      return Status::InvalidArgument("'" + std::string(item) +
                                     "': an IPv6 address must be written in brackets");
    }
    ep.host = std::string(item.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = item.substr(colon + 1);
      if (port.empty()) return Status::InvalidArgument("empty port");
    }
  }
  if (ep.host.empty()) return Status::InvalidArgument("empty host in '" + std::string(item) + "'");
  if (!port.empty()) {
    auto p = redis::ParsePort(port);
    if (!p.ok()) return p.status();
    ep.port = *p;
  }
  return ep;
}

}  // namespace

Result<std::vector<RedisEndpoint>> ParseRedisUrl(std::string_view url) {
  if (url.substr(0, kScheme.size()) != kScheme) {
    return Status::InvalidArgument("'" + std::string(url) + "': the scheme must be redis://");
  }
  std::string_view rest = url.substr(kScheme.size());
  if (rest.find('@') != std::string_view::npos) {
    return Status::InvalidArgument("a user or password in the URL is not supported");
  }
  if (const size_t q = rest.find('?'); q != std::string_view::npos) {
    return Status::InvalidArgument("a query ('" + std::string(rest.substr(q)) +
                                   "') is not supported");
  }
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    return Status::InvalidArgument("a path ('" + std::string(rest.substr(slash)) +
                                   "') is not supported");
  }
  std::vector<RedisEndpoint> seeds;
  while (true) {
    const size_t comma = rest.find(',');
    auto ep = ParseUrlHost(rest.substr(0, comma));
    if (!ep.ok()) {
      return Status::InvalidArgument("host " + std::to_string(seeds.size() + 1) + " of '" +
                                     std::string(url) + "': " + ep.status().message());
    }
    seeds.push_back(std::move(ep).value());
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return seeds;
}

Status RedisClusterOptions::Validate() const {
  if (seeds.empty()) return Status::InvalidArgument("seeds: at least one is needed");
  for (const RedisEndpoint& s : seeds) {
    if (s.host.empty()) return Status::InvalidArgument("seeds: a host is empty");
    if (s.port == 0) return Status::InvalidArgument("seeds: port 0 of " + s.host);
  }
  if (pool_size < 1 || pool_size > 256) {
    return Status::InvalidArgument("pool_size " + std::to_string(pool_size) + " is not in 1..256");
  }
  if (connect_timeout.count() <= 0) return Status::InvalidArgument("connect_timeout must be > 0");
  if (io_timeout.count() <= 0) return Status::InvalidArgument("io_timeout must be > 0");
  if (reconnect_backoff.count() < 0) {
    return Status::InvalidArgument("reconnect_backoff must be >= 0");
  }
  if (topology_refresh.count() < 0) return Status::InvalidArgument("topology_refresh must be >= 0");
  if (max_redirects < 1 || max_redirects > 16) {
    return Status::InvalidArgument("max_redirects " + std::to_string(max_redirects) +
                                   " is not in 1..16");
  }
  return Status::Ok();
}

uint16_t RedisCluster::KeySlot(std::string_view key) {
  if (const size_t open = key.find('{'); open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  uint16_t crc = 0;  // CRC16-XMODEM: polynomial 0x1021, initial 0, no reflection
  for (const char c : key) {
    crc ^= static_cast<uint16_t>(static_cast<unsigned char>(c) << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc & (redis::kNumSlots - 1);
}

}  // namespace kvtier
