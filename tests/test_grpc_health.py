"""The standard grpc.health.v1 service of rank 0, read with grpcio-health-checking's own stub:
SERVING once the server accepts calls, NOT_SERVING as soon as it drains."""
import json
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import dashinfer_client as allspark
from dashinfer_client.proto import load
from dashinfer_server.engine import Engine
from dashinfer_server.grpc_server import serve
from tests.engine_helpers import API_CONTEXT

pb, pb_grpc = load()
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def _check(channel, service=""):
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def test_health_serving_then_not_serving_while_draining(serialized_tiny, tmp_path):
    engine = Engine()
    cfg = serialized_tiny("llama", max_position_embeddings=API_CONTEXT).create_reference_runtime_config_builder(
        "tiny", allspark.TargetDevice.CPU, [0], max_batch=2).max_length(4096).build()
    assert engine.install_model(cfg) == 0 and engine.start_model("tiny") == 0
    server = serve(engine, f"unix://{tmp_path}/h.sock")
    drain = threading.Thread(target=server.shutdown, args=(60,))
    try:
        with grpc.insecure_channel(server.address) as channel:
            assert _check(channel) == SERVING
            assert _check(channel, "dashinfer.DashInfer") == SERVING
            with pytest.raises(grpc.RpcError) as unknown:
                _check(channel, "no.such.Service")
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            assert next(watch).status == SERVING

            # a long request keeps the drain going while the health service is asked
            stub = pb_grpc.DashInferStub(channel)
            gen = allspark.ASGenerationConfigBuilder().update(
                {"top_k": 1, "max_length": 4096, "early_stopping": False}).build().to_dict()
            call = stub.StartRequest(pb.StartRequestRequest(
                model_name="tiny", input_ids=[5, 17, 101], input_shape=[3], generation_config_json=json.dumps(gen)))
            handle = next(call).handle
            drain.start()
            assert next(watch).status == NOT_SERVING  # pushed to the watcher when the drain begins
            assert _check(channel) == NOT_SERVING and _check(channel, "dashinfer.DashInfer") == NOT_SERVING
            assert drain.is_alive()  # still draining: the request runs
            assert stub.StopRequest(pb.RequestRef(model_name="tiny", id=handle)).status == 0
            watch.cancel()
            call.cancel()
        drain.join(60)
        assert not drain.is_alive()
    finally:
        if not drain.is_alive() and not drain.ident:
            server.stop()
        engine.release_model("tiny")
