"""Who may do what on the gRPC service (docs/security.md): requests belong to the session that
started them, handles cannot be guessed, a token guards every call when set (and is required off
this machine), model calls are an admin's, TLS over TCP, the default socket's directory and mode."""
import argparse
import json
import os
import stat
import subprocess
import sys
import tempfile

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import dashinfer_client as allspark
from dashinfer_client import AsStatus
from dashinfer_client.client_engine import Unavailable
from dashinfer_client.proto import load
from dashinfer_client.proto.wire import default_address, private_socket_dir, unix_socket_path
from dashinfer_server.access import Access, from_arguments, read_token
from dashinfer_server.engine import Engine
from dashinfer_server.grpc_server import Server, serve

pb, pb_grpc = load()
PROMPT = [5, 17, 101, 33, 7, 250, 64, 12]
TOKEN, ADMIN = "user-token-123", "admin-token-456"


def _config(tiny_model):
    return (allspark.AsModelRuntimeConfigBuilder().model_name("tiny").model_dir(tiny_model, "tiny")
            .max_length(4096).max_batch(4).build())


def _gen(max_length):
    return json.dumps(allspark.ASGenerationConfigBuilder().update(
        {"top_k": 1, "max_length": max_length, "early_stopping": False}).build().to_dict())


def _start(stub, max_length, metadata=(), **fields):
    return stub.StartRequest(pb.StartRequestRequest(model_name="tiny", input_ids=PROMPT, input_shape=[len(PROMPT)],
                                                    generation_config_json=_gen(max_length), **fields),
                             metadata=metadata)


@pytest.fixture(scope="module")
def engine(tiny_model):
    e = Engine()
    assert e.install_model(_config(tiny_model)) == 0 and e.start_model("tiny") == 0
    yield e
    e.release_model("tiny")


@pytest.fixture
def unix_server(engine, tmp_path):
    srv = serve(engine, f"unix://{tmp_path}/s.sock")
    yield srv
    srv.stop()


def _session(stub):
    """An open Session stream and the metadata that names it."""
    stream = stub.Session(pb.SessionRequest())
    return stream, [("dashinfer-session", next(stream).session_id)]


def test_another_session_can_neither_stop_release_nor_sync_a_request(unix_server, engine):
    with grpc.insecure_channel(unix_server.address) as channel:
        stub = pb_grpc.DashInferStub(channel)
        first, mine = _session(stub)
        other, theirs = _session(stub)
        handle = next(_start(stub, 4000, session_id=mine[0][1], events_on_session=True)).handle
        ref = pb.RequestRef(model_name="tiny", id=handle)
        # what the in-process Engine answers for a handle it never gave out
        assert engine.stop_request("tiny", handle) == AsStatus.ALLSPARK_ILLEGAL_REQUEST_ID
        never_given = engine.last_error
        for call, what in ((stub.StopRequest, "stop_request"), (stub.ReleaseRequest, "release_request"),
                           (stub.SyncRequest, "sync_request")):
            for metadata in (theirs, ()):  # another session, and a caller without any
                reply = call(ref, metadata=metadata, timeout=10)
                assert (reply.status, reply.message) == (AsStatus.ALLSPARK_ILLEGAL_REQUEST_ID,
                                                         never_given.replace("stop_request", what))
        # another session's sync of "every request of the model" does not wait for this one
        assert stub.SyncRequest(pb.RequestRef(model_name="tiny"), metadata=theirs, timeout=10).status == 0
        assert stub.GetStats(pb.Empty()).models[0].running == 1  # still generating
        assert stub.StopRequest(ref, metadata=mine, timeout=30).status == 0
        assert stub.ReleaseRequest(ref, metadata=mine).status == 0
        first.cancel()
        other.cancel()


def test_handles_are_random_and_differ_in_many_bits(unix_server):
    with grpc.insecure_channel(unix_server.address) as channel:
        stub = pb_grpc.DashInferStub(channel)
        handles = []
        for _ in range(64):
            events = list(_start(stub, len(PROMPT) + 1))
            handles.append(events[0].handle)
            stub.ReleaseRequest(pb.RequestRef(model_name="tiny", id=handles[-1]))
    assert len(set(handles)) == 64 and min(handles) > 0
    # 63 random bits: every bit position is set in some handles and clear in others, and two
    # handles in a row differ in many bits (sequential ones differ in one or two)
    for bit in range(63):
        assert 0 < sum(h >> bit & 1 for h in handles) < 64, f"bit {bit} never changes"
    assert min(bin(a ^ b).count("1") for a, b in zip(handles, handles[1:])) >= 8


def test_tcp_beyond_loopback_without_a_token_is_refused_at_start(tmp_path):
    with pytest.raises(ValueError, match="without a token"):
        Server(Engine(), "0.0.0.0:0")
    run = subprocess.run([sys.executable, "-m", "dashinfer_server", "--address", "0.0.0.0:0"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 78 and "refusing to listen on 0.0.0.0:0 without a token" in run.stderr
    srv = serve(Engine(), "0.0.0.0:0", access=Access(TOKEN))  # with one it starts
    srv.stop()
    assert Server(Engine(), "127.0.0.1:0") and Server(Engine(), f"unix://{tmp_path}/a.sock")  # local: allowed


def test_token_is_required_on_every_call_but_health_probes(engine):
    srv = serve(engine, "127.0.0.1:0", access=Access(TOKEN))
    try:
        with grpc.insecure_channel(srv.address) as channel:
            stub = pb_grpc.DashInferStub(channel)
            for metadata in ((), [("authorization", "Bearer wrong")], [("authorization", TOKEN)]):
                for call in (lambda m: stub.Health(pb.Empty(), metadata=m, timeout=10),
                             lambda m: next(_start(stub, 20, metadata=m))):
                    with pytest.raises(grpc.RpcError) as refused:
                        call(metadata)
                    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    assert "requires a token" in refused.value.details()
            right = [("authorization", f"Bearer {TOKEN}")]
            assert stub.Health(pb.Empty(), metadata=right, timeout=10).ready
            events = list(_start(stub, 20, metadata=right))
            assert events[0].started.status == 0
            assert events[-1].status == allspark.GenerateRequestStatus.GenerateFinished
            probe = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert probe.status == health_pb2.HealthCheckResponse.SERVING  # probes carry no token
        with pytest.raises(Unavailable, match="requires a token"):
            allspark.ClientEngine(srv.address, startup_timeout=10)
        # a token read from a file with its newline: the client's mistake, said as such (grpc refuses
        # to send it, which read as "does not answer as a dashinfer server")
        for bad in (TOKEN + "\n", "caf\u00e9"):
            with pytest.raises(ValueError, match="token must be printable ASCII"):
                allspark.ClientEngine(srv.address, startup_timeout=10, token=bad)
        with allspark.ClientEngine(srv.address, startup_timeout=10, token=TOKEN) as client:
            status, _, queue = client.start_request_ids("tiny", None, PROMPT, allspark.ASGenerationConfigBuilder()
                                                         .update({"top_k": 1, "max_length": 20}))
            assert status == 0 and queue.Get() is not None
    finally:
        srv.stop()


def test_model_calls_are_an_admins(engine, tiny_model, tmp_path):
    cfg = (allspark.AsModelRuntimeConfigBuilder().model_name("tiny2").model_dir(tiny_model, "tiny")
           .max_length(256).max_batch(1).build())
    tcp = serve(engine, "127.0.0.1:0", access=Access(TOKEN))  # no admin token: no admin over TCP
    try:
        with allspark.ClientEngine(tcp.address, startup_timeout=10, token=TOKEN) as client:
            assert client.install_model(cfg) == AsStatus.ALLSPARK_REQUEST_DENIED
            assert "admin action" in client.last_error and "over TCP" in client.last_error
            for call in (client.start_model, client.stop_model, client.release_model):
                assert call("tiny") == AsStatus.ALLSPARK_REQUEST_DENIED
            assert client.get_model_state("tiny") == "Running"
    finally:
        tcp.stop()
    admin = serve(engine, "127.0.0.1:0", access=Access(TOKEN, ADMIN))
    try:
        with allspark.ClientEngine(admin.address, startup_timeout=10, token=TOKEN) as client:
            assert client.install_model(cfg) == AsStatus.ALLSPARK_REQUEST_DENIED
            assert "must carry the admin token" in client.last_error
        with allspark.ClientEngine(admin.address, startup_timeout=10, token=ADMIN) as client:
            assert client.install_model(cfg) == 0 and client.release_model("tiny2") == 0
    finally:
        admin.stop()
    local = serve(engine, f"unix://{tmp_path}/admin.sock")  # a unix socket: its permissions decide
    try:
        with allspark.ClientEngine(local.address, startup_timeout=10) as client:
            assert client.install_model(cfg) == 0 and client.release_model("tiny2") == 0
    finally:
        local.stop()


def _self_signed(folder):
    """(certificate PEM path, key PEM path) for localhost / 127.0.0.1, made here."""
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    try:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
        return cert, key
    import ipaddress
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now)
                   .not_valid_after(now + datetime.timedelta(days=1)).add_extension(san, critical=False)
                   .sign(private, hashes.SHA256()))
    with open(cert, "wb") as f:
        f.write(certificate.public_bytes(serialization.Encoding.PEM))
    with open(key, "wb") as f:
        f.write(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return cert, key


def test_tls_round_trip_with_a_self_signed_certificate(engine, tmp_path):
    cert, key = _self_signed(str(tmp_path))
    with open(cert, "rb") as c, open(key, "rb") as k:
        tls = (c.read(), k.read())
    srv = serve(engine, "127.0.0.1:0", access=Access(TOKEN), tls=tls)
    try:
        with allspark.ClientEngine(srv.address, startup_timeout=10, token=TOKEN, tls_ca=cert) as client:
            gen = allspark.ASGenerationConfigBuilder().update({"top_k": 1, "max_length": 30, "early_stopping": False})
            status, _, queue = client.start_request_ids("tiny", None, PROMPT, gen)
            assert status == 0
            ids = []
            while (got := queue.Get()) is not None:
                ids += got.ids_from_generate
        status, _, local = engine.start_request_ids("tiny", None, PROMPT, gen)
        expected = []
        while (got := local.Get()) is not None:
            expected += got.ids_from_generate
        assert ids == expected and len(ids) == 30 - len(PROMPT)
        # what the connection met, not only that nothing answered: a certificate nobody vouches for
        with pytest.raises(Unavailable, match=r"within 1 s \(.*CERTIFICATE_VERIFY_FAILED"):
            allspark.ClientEngine(srv.address, startup_timeout=1, token=TOKEN, tls_ca=True)
        with pytest.raises(Unavailable, match=r"within 1 s \(.*failed to connect"):  # plain text to a TLS port
            allspark.ClientEngine(srv.address, startup_timeout=1, token=TOKEN)
    finally:
        srv.stop()


def test_default_socket_directory_is_private_and_checked(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    own = tmp_path / f"dashinfer-{os.getuid()}"
    path = unix_socket_path(default_address())
    assert os.path.dirname(path) == str(own)
    st = os.lstat(own)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    os.chmod(own, 0o755)
    with pytest.raises(RuntimeError, match="open to others"):
        private_socket_dir()
    os.rmdir(own)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, own)  # a link planted by someone else
    with pytest.raises(RuntimeError, match="not a directory"):
        private_socket_dir()
    os.unlink(own)
    if os.getuid() == 0:
        own.mkdir(mode=0o700)
        os.chown(own, 65534, 65534)  # another user's
        with pytest.raises(RuntimeError, match="belongs to uid 65534"):
            private_socket_dir()
        os.rmdir(own)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert private_socket_dir() == str(runtime)
    os.chmod(runtime, 0o755)  # not private: not used
    assert private_socket_dir() == str(own)


def test_the_socket_is_made_with_its_mode(engine, tmp_path, monkeypatch):
    """The mode is the socket's from its creation (a chmod after it listens leaves a moment when
    anyone may connect): with chmod doing nothing, the socket is still 0660."""
    chmods = []
    monkeypatch.setattr(os, "chmod", lambda *a, **k: chmods.append(a))
    umask = os.umask(0o022)
    try:
        srv = serve(engine, f"unix://{tmp_path}/m/s.sock")
        try:
            assert stat.S_IMODE(os.stat(srv.socket_path).st_mode) == 0o660
            assert stat.S_IMODE(os.stat(tmp_path / "m").st_mode) == 0o700  # a folder it made: private
        finally:
            srv.stop()
        assert os.umask(0o022) == 0o022  # given back
    finally:
        os.umask(umask)


def test_tokens_from_files_and_their_checks(tmp_path):
    f = tmp_path / "token"
    f.write_text("from-a-file\n")
    f.chmod(0o600)
    assert read_token(path=str(f)) == "from-a-file" and read_token("given") == "given" and read_token() is None
    for bad in ("", "has space", "caf\u00e9"):
        with pytest.raises(ValueError, match="printable ASCII"):
            read_token(bad)
    with pytest.raises(ValueError, match="cannot read the token file"):
        read_token(path=str(tmp_path / "missing"))


def test_server_flags_and_environment_give_the_tokens_and_tls(tmp_path):
    user, admin = tmp_path / "user", tmp_path / "admin"
    user.write_text("u-123\n")
    admin.write_text("a-456\n")
    flags = dict(token=None, token_file=None, admin_token=None, admin_token_file=None, tls_cert=None, tls_key=None)
    access, tls = from_arguments(argparse.Namespace(**flags), {"DASHINFER_TOKEN_FILE": str(user),
                                                               "DASHINFER_ADMIN_TOKEN_FILE": str(admin)})
    assert (access.token, access.admin_token, tls) == ("u-123", "a-456", None)
    access, _ = from_arguments(argparse.Namespace(**dict(flags, token="flag-1")), {"DASHINFER_TOKEN": "env-1"})
    assert access.token == "flag-1" and access.admin_token is None  # the flag before the environment
    with pytest.raises(ValueError, match="go together"):
        from_arguments(argparse.Namespace(**dict(flags, tls_cert=str(user))), {})
    run = subprocess.run([sys.executable, "-m", "dashinfer_server", "--address", f"unix://{tmp_path}/x.sock",
                          "--tls-cert", str(user), "--tls-key", str(admin)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 78 and "TLS is for TCP addresses" in run.stderr
