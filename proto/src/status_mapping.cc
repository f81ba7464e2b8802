#include "kvtier/proto/status_mapping.h"

namespace kvtier {

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  int code = static_cast<int>(status.code());
  if (status.code() == StatusCode::kIOError) code = grpc::StatusCode::INTERNAL;
  return grpc::Status(static_cast<grpc::StatusCode>(code), status.message());
}

Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return Status::Ok();
  int code = status.error_code();
  if (code < 0 || code > static_cast<int>(StatusCode::kDataLoss)) code = 2;  // UNKNOWN
  return Status(static_cast<StatusCode>(code), status.error_message());
}

}  // namespace kvtier
