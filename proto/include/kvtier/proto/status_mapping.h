// The one mapping between kvtier::Status and grpc::Status.
#pragma once

#include <grpcpp/support/status.h>

#include "kvtier/status.h"

namespace kvtier {

// IO_ERROR travels as INTERNAL; every other code keeps its number.
grpc::Status ToGrpcStatus(const Status& status);
Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvtier
