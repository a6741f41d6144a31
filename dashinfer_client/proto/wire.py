"""The wire format: Python objects <-> the messages of proto/dashinfer.proto, both directions.

Used by both ends (ClientEngine and the gRPC service of rank 0), so each encoding sits beside its
decoding: request events (a ResultQueue's news), input ids, configs, handles, statistics. Also
what else the two ends must agree on outside the messages: addresses (the default unix socket in
a private directory, unix: parsing, which addresses are local), call metadata (token, session),
keepalive pings and the server's log-line format, which a ClientEngine reads back from the
output of a group it spawned.
"""
import ipaddress
import json
import os
import re
import stat
import tempfile
import uuid

import numpy as np

from ..api import ModelState
from ..config import ASGenerationConfig, AsModelRuntimeConfig
from .. import settings
from ..settings import TOKEN_CHARS
from ..types import FINAL_STATUSES, GenerateRequestStatus, RequestStatInfo
from . import load

pb, pb_grpc = load()

_COUNT_KEYS = frozenset(RequestStatInfo.COUNT_KEYS)


def keepalive_options(server: bool) -> list:
    """gRPC's keepalive options of either end (DASHINFER_KEEPALIVE_MS, _TIMEOUT_MS). Each end pings
    a quiet connection and drops it when a ping goes unanswered: a peer gone without closing its
    TCP connection is let go within their sum, not TCP's hours. Pings go on without data between
    them (gRPC stops after 2 by default; a ClientEngine's session may idle for hours). The server
    ends a connection pinged more often than it accepts (GOAWAY "too_many_pings"): it takes a
    quarter of its period (of the default, if that is shorter), so a client may ping twice as
    often as it does, and one with the default settings always passes."""
    every, timeout = settings.get("DASHINFER_KEEPALIVE_MS"), settings.get("DASHINFER_KEEPALIVE_TIMEOUT_MS")
    # gRPC core ends a connection on an unanswered ping after ping_timeout_ms (default 60 s), not
    # keepalive_timeout_ms, unless an experiment is on (grpc/grpc#39239): both are set.
    options = [("grpc.keepalive_time_ms", every), ("grpc.keepalive_timeout_ms", timeout),
               ("grpc.http2.ping_timeout_ms", timeout), ("grpc.http2.max_pings_without_data", 0)]
    if server:
        default = settings.REGISTRY["DASHINFER_KEEPALIVE_MS"].default
        options += [("grpc.keepalive_permit_without_calls", 1),
                    ("grpc.http2.min_ping_interval_without_data_ms", min(every, default) // 4)]
    return options


# The largest message either end sends or accepts (gRPC's own receive limit is 4 MiB): a prompt of
# millions of ids fits; a client refuses a larger request before sending it.
MAX_MESSAGE_BYTES = 64 * 2**20
MESSAGE_SIZE_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]

# ---- addresses -------------------------------------------------------------------------------------


def private_socket_dir() -> str:
    """A directory only this user can enter, for its sockets: $XDG_RUNTIME_DIR when it is one (a
    directory of ours, mode 0700), else $TMPDIR (default /tmp)/dashinfer-<uid>, created 0700.
    Raises RuntimeError when that one exists but is not such a directory (another user's, a
    symlink, open to others): a socket there could be reached, or replaced, by someone else."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _private_dir_problem(runtime) is None:
        return runtime
    folder = os.path.join(tempfile.gettempdir(), f"dashinfer-{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)  # atomic: it is ours, or it was there already and is checked below
    except FileExistsError:
        pass
    problem = _private_dir_problem(folder)
    if problem:
        raise RuntimeError(f"refusing to put a socket in {folder}: {problem}; remove it, or set "
                           f"XDG_RUNTIME_DIR to a private directory, or pass an address")
    return folder


def _private_dir_problem(folder):
    """Why `folder` is not a directory private to this user, or None when it is."""
    try:
        st = os.lstat(folder)
    except OSError as e:
        return f"cannot read it ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory (a symlink or a file)"
    if st.st_uid != os.getuid():
        return f"it belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})"
    if st.st_mode & 0o077:
        return f"its mode is {stat.S_IMODE(st.st_mode):04o}, open to others (0700 expected)"
    return None


def default_address(unique=False) -> str:
    """A unix socket only this user can reach: private_socket_dir()/dashinfer-<uid>-<pid>.sock;
    unique: with a random suffix too (a client spawning several groups)."""
    suffix = f"-{uuid.uuid4().hex[:8]}" if unique else ""
    return f"unix://{private_socket_dir()}/dashinfer-{os.getuid()}-{os.getpid()}{suffix}.sock"


def unix_socket_path(address: str):
    """The file of a unix:PATH / unix:///PATH address, else None."""
    if not address.startswith("unix:"):
        return None
    path = address[len("unix:"):]
    return path[2:] if path.startswith("//") else path


def is_local_address(address: str) -> bool:
    """Whether only this machine can reach `address`: a unix socket (a file: its permissions say
    who) or a loopback host (127.0.0.0/8, ::1, localhost). Anything else (0.0.0.0, a host name, an
    abstract socket, which any process of the network namespace can reach) is not."""
    if unix_socket_path(address) is not None:
        return True
    host = address.rsplit(":", 1)[0] if ":" in address else address
    for scheme in ("dns:///", "ipv4:", "ipv6:"):
        host = host[len(scheme):] if host.startswith(scheme) else host
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Call metadata: the token a server may require ("Bearer <token>"), and the session a call acts
# for (its requests are the session's own; Session's first event names it).
TOKEN_METADATA = "authorization"
SESSION_METADATA = "dashinfer-session"


def check_token(value, what="token") -> str:
    """`value` when it can travel as call metadata (settings.TOKEN_CHARS); ValueError otherwise."""
    if not isinstance(value, str) or not value or not set(value) <= TOKEN_CHARS:
        raise ValueError(f"the {what} must be printable ASCII without spaces, and not empty (one read "
                         f"from a file loses its newline first)")
    return value


# ---- the server's log lines ------------------------------------------------------------------------

# "<date> <time> <logger>[<pid>] <LEVEL> <message>"
LOG_FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"
_LOG_RECORD = re.compile(r"^\S+ \S+ (\S+\[\d+\]) (DEBUG|INFO|WARNING|ERROR|CRITICAL) (.*)$")


# The logger of the engine's one line per finished request. A front door that logs its own line
# per request (`dashinfer serve`) raises this one's level, in its process and for the ranks it spawned.
REQUEST_LOGGER = "dashinfer_server.requests"


def parse_log_line(line):
    """(level name, "logger[pid]: message") of a line LOG_FORMAT wrote, else None (a traceback's
    continuation or foreign output)."""
    record = _LOG_RECORD.match(line)
    return (record.group(2), f"{record.group(1)}: {record.group(3)}") if record else None


# ---- configs, ids, handles -------------------------------------------------------------------------


def _loads(text: str):
    """json.loads, a document nested too deeply for the parser refused with ValueError like any
    other bad JSON (json raises RecursionError on it)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("bad JSON: nested too deeply") from None


def encode_runtime_config(cfg: AsModelRuntimeConfig) -> str:
    """The config's JSON, model_dir made absolute (the server's working directory is not ours)."""
    d = cfg.to_dict()
    d["model_dir"] = os.path.abspath(d["model_dir"])
    return json.dumps(d)


def decode_runtime_config(text: str) -> AsModelRuntimeConfig:
    """Raises ValueError or TypeError on a bad config."""
    return AsModelRuntimeConfig.from_dict(_loads(text))


def encode_generation(gen) -> str:
    """An ASGenerationConfig (or the user's dict, for the server's Engine to check) as JSON."""
    return json.dumps(gen.to_dict() if isinstance(gen, ASGenerationConfig) else gen, default=repr)


def decode_generation(text: str):
    """The dict the Engine checks; raises ValueError on bad JSON."""
    return _loads(text or "{}")


def encode_ids(input_ids) -> dict:
    """input_ids as StartRequestRequest fields: an integer array's values and shape, else its JSON
    (for the server's Engine to refuse with its own message)."""
    try:
        arr = np.asarray(input_ids.tolist() if hasattr(input_ids, "tolist") else input_ids)
    except Exception:
        arr = None
    # a 0-d array too, which the Engine refuses by its shape
    if arr is not None and (arr.dtype.kind in "iu" or arr.size == 0):
        if arr.size == 0 or (arr.min() >= -2**63 and arr.max() < 2**63):
            return {"input_ids": arr.astype(np.int64).ravel().tolist(), "input_shape": list(arr.shape)}
    try:
        return {"input_ids_json": json.dumps(input_ids, default=repr)}
    except (TypeError, ValueError):
        return {"input_ids_json": json.dumps(repr(input_ids))}


def decode_ids(request):
    """The input_ids of a StartRequestRequest; ValueError when the values do not fill the shape."""
    if request.input_ids_json:
        return _loads(request.input_ids_json)
    ids = np.array(request.input_ids, dtype=np.int64)
    shape = tuple(request.input_shape)
    if int(np.prod(shape)) != ids.size:
        raise ValueError(f"input_ids: {ids.size} values do not fill the shape {list(shape)}")
    return ids.reshape(shape)


def encode_request_ref(model_name, server_handle=None):
    """A RequestRef: one request (its handle on the server), or every request of the model."""
    if server_handle is None:
        return pb.RequestRef(model_name=model_name)
    return pb.RequestRef(model_name=model_name, id=server_handle)


def decode_handle(request):
    """The handle a RequestRef names, or None when it names none."""
    return request.id if request.HasField("id") else None


# ---- request events --------------------------------------------------------------------------------


def encode_event(queue, status, elements, sent) -> pb.RequestEvent:
    """What a client's queue needs to mirror `queue` after `elements` (GeneratedElements or None)
    were taken from it. status: the queue's, read before they were taken (a final one then comes
    after every token it carries); the statistics are read here, after it (a final status carries
    the final ones). sent: the statistics the stream has carried so far (updated): only changed
    entries go, and never generated_token_length, which the client's queue counts itself."""
    stats = queue.RequestStatInfo()
    reason = stats.pop("finish_reason")  # the strings have their own fields
    changed = {k: v for k, v in stats.items() if sent.get(k) != v and k != "generated_token_length"}
    sent.update(changed)
    uuid_ = changed.pop("uuid", "")  # sent once
    event = pb.RequestEvent(status=int(status), error=queue.error or "", stats=changed,
                            finish_reason=reason, uuid=uuid_)
    if elements is not None:
        event.ids.extend(elements.ids_from_generate)
        for top in elements.log_probs_list:
            event.log_probs.add(ids=[i for i, _ in top], logprobs=[p for _, p in top])
        event.token_logprobs.extend(elements.token_logprobs_list)
        event.prefix_cache_len = elements.prefix_cache_len
        event.prefix_len_gpu = elements.prefix_len_gpu
        event.prefix_len_cpu = elements.prefix_len_cpu
        event.prompt_token_logprobs.extend(elements.prompt_token_logprobs_list)
        for top in elements.prompt_log_probs_list:
            event.prompt_log_probs.add(ids=[i for i, _ in top], logprobs=[p for _, p in top])
        event.prompt_token_ranks.extend(elements.prompt_token_ranks_list)
    return event


def merge_elements(a, b):
    """Two GeneratedElements in delivery order as one (either may be None)."""
    if a is None or b is None:
        return a or b
    a.ids_from_generate += b.ids_from_generate
    a.log_probs_list += b.log_probs_list
    a.token_logprobs_list += b.token_logprobs_list
    a.prompt_token_logprobs_list += b.prompt_token_logprobs_list  # one of them has none
    a.prompt_log_probs_list += b.prompt_log_probs_list
    a.prompt_token_ranks_list += b.prompt_token_ranks_list
    a.prefix_cache_len, a.prefix_len_gpu, a.prefix_len_cpu = b.prefix_cache_len, b.prefix_len_gpu, b.prefix_len_cpu
    return a


def apply_event(event, queue) -> None:
    """Mirror one server event into the client's queue: tokens first, then the status."""
    status = GenerateRequestStatus(event.status)
    if event.stats:
        queue.update_stats({k: int(v) if k in _COUNT_KEYS else v for k, v in event.stats.items()})
    if event.finish_reason:
        queue.update_stats(finish_reason=event.finish_reason)
    if event.uuid:
        queue.update_stats(uuid=event.uuid)
    if event.ids:
        logprobs = token_logprobs = None
        if event.token_logprobs:
            logprobs = [list(zip(top.ids, top.logprobs)) for top in event.log_probs]
            token_logprobs = list(event.token_logprobs)
        prompt_logprobs = None
        if event.prompt_token_ranks:  # a ranks list is never empty where prompt logprobs came
            prompt_logprobs = (list(event.prompt_token_logprobs),
                               [list(zip(top.ids, top.logprobs)) for top in event.prompt_log_probs],
                               list(event.prompt_token_ranks))
        queue.push(list(event.ids), logprobs, token_logprobs, prefix_cache_len=event.prefix_cache_len,
                   prefix_len_gpu=event.prefix_len_gpu, prefix_len_cpu=event.prefix_len_cpu,
                   prompt_logprobs=prompt_logprobs)
    if status in FINAL_STATUSES or status > queue.GenerateStatus():
        queue.set_status(status, event.error or None)


# ---- statistics ------------------------------------------------------------------------------------

_MODEL_COUNTS = ("requests", "running", "waiting", "kv_blocks_total", "kv_blocks_free", "preemptions")
_SERVICE_KEYS = ("streams", "sessions", "draining")


def encode_stats(stats: dict, reply) -> pb.StatsReply:
    """An engine's get_stats() dict (api.EngineAPI.get_stats) as a StatsReply."""
    models = [pb.ModelStats(model_name=name, state=m["state"].value,
                            runtime_config_json=json.dumps(m["runtime_config"]),
                            **{k: m[k] for k in _MODEL_COUNTS})
              for name, m in stats["models"].items()]
    return pb.StatsReply(reply=reply, models=models, **{k: stats[k] for k in _SERVICE_KEYS})


def decode_stats(reply) -> dict:
    """A StatsReply as get_stats() returns it."""
    models = {m.model_name: {"state": ModelState(m.state), **{k: getattr(m, k) for k in _MODEL_COUNTS},
                             "runtime_config": json.loads(m.runtime_config_json)}
              for m in reply.models}
    return {"models": models, **{k: getattr(reply, k) for k in _SERVICE_KEYS}}


# ---- introspection queries -------------------------------------------------------------------------


def encode_query(method: str, args) -> pb.QueryRequest:
    return pb.QueryRequest(method=method, args_json=json.dumps(list(args)))


def decode_query_args(request) -> list:
    """The arguments of a QueryRequest; ValueError when they are not a JSON list."""
    args = _loads(request.args_json or "[]")
    if not isinstance(args, list):
        raise ValueError("query arguments: not a JSON list")
    return args


def encode_query_reply(result, reply) -> pb.QueryReply:
    """A query's value (an object with to_dict(), or JSON-able data) and its Reply."""
    value = result.to_dict() if hasattr(result, "to_dict") else result
    return pb.QueryReply(reply=reply, result_json=json.dumps(value))


def decode_query_result(reply):
    return _loads(reply.result_json or "null")
