"""KServe v2 / Open Inference Protocol over gRPC (Triton's `inference.GRPCInferenceService`):
`start_grpc_server` listens beside the HTTP server, over the same `ServerState`.

- `proto/`: the protocol's messages, generated from `.proto` files that keep Triton's names and
  field numbers (its README says how to regenerate them);
- `codec.py`: protobuf messages to and from the KServe core shared with HTTP (`kserve.py`);
- `service.py`: the RPC handlers, the API key check and the one error mapping;
- `server.py`: the grpc.aio listener and its drain.
"""

from queryserve.server.grpc.server import GrpcServer, start_grpc_server

__all__ = ["GrpcServer", "start_grpc_server"]
