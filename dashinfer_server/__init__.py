"""dashinfer-py runtime: Engine, scheduler, model forward, tensor parallelism, gRPC service."""
