#include "kvtier/proto/transport_args.h"

#include <grpc/grpc.h>

namespace kvtier {

std::vector<std::pair<const char*, int>> TransportArgs() {
  return {
      {GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, kMaxMessageBytes},
      {GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, kMaxMessageBytes},
      {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20},
      {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (16 << 20) - 1},
      {GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 8 << 20},
      {GRPC_ARG_HTTP2_BDP_PROBE, 0},
      {GRPC_ARG_ENABLE_RETRIES, 0},
  };
}

}  // namespace kvtier
