// gRPC transport settings shared by the daemon and its clients, tuned for a
// Unix socket carrying batched requests of up to a few MiB of token ids: a
// large HTTP/2 window and frame size, so that one Lookup of a 128K-token prompt
// (512 KiB) crosses without flow-control round trips.
#pragma once

#include <utility>
#include <vector>

namespace kvtier {

// Largest message either side accepts: 128 MiB (32M token ids).
inline constexpr int kMaxMessageBytes = 128 << 20;

// The gRPC metadata key that carries a session's token (SessionOpened.session_token)
// on every other KvCache call of that session.
inline constexpr char kSessionTokenKey[] = "kvtier-session-token";

// (gRPC channel argument name, value) pairs for both ends.
std::vector<std::pair<const char*, int>> TransportArgs();

}  // namespace kvtier
