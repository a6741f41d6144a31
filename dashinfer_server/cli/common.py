"""What the subcommands share: the one-line error, the model argument, the rank count check, and
SIGTERM during a conversion."""
import contextlib
import signal
import threading

from dashinfer_server.arguments import at_least
# EX_CONFIG: a supervisor must not restart a service that cannot start
from dashinfer_server.systemd import EX_CONFIG as CONFIG_ERROR


DEFAULT_NAMES = ("default", "SmolLM2-135M-Instruct")  # MODEL left out means the default model too


def first_paragraph(doc) -> str:
    """A module docstring's first paragraph on one line: a subcommand's whole --help description."""
    return " ".join(doc.split("\n\n")[0].split())


class CliError(Exception):
    """An expected failure: printed as one line, the command exits with `code`."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


class Terminated(BaseException):
    """SIGTERM while a conversion runs (systemd stopping a first start's conversion, a killed
    `dashinfer convert`), raised so that the conversion removes its temporary files on the way
    out; main() then ends the process by the signal, as it would have ended."""


@contextlib.contextmanager
def terminated_cleanly():
    """Within: SIGTERM raises Terminated in the main thread instead of ending the process at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def add_model_options(p) -> None:
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float32", "float16"),
                   help="weights dtype of a converted model (default bfloat16; a serialized model: what it holds)")
    p.add_argument("--quant", default=None, choices=("int8", "uint4", "none"),
                   help="weight-only quantization of the linear layers when converting (default: none, but a "
                        "checkpoint quantized as released at its own width: a 4-bit AWQ or compressed-tensors "
                        "release as uint4, an 8-bit one as int8; none: float weights always)")


def add_engine_options(p) -> None:
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel ranks, one per NUMA node (1: in this process; default 1)")
    p.add_argument("--threads", type=int, default=0, help="compute threads per rank (default: its node's cores)")
    p.add_argument("--max-model-len", type=at_least(1), default=None,
                   help="longest request, prompt + answer, in tokens (default: min(context, 2048))")


def resolve(model, dtype, quant):
    """(model_dir, prefix) of the serialized model for MODEL (converted once and cached)."""
    from dashinfer_client.errors import ModelSerializerException
    from dashinfer_client.model_cache import resolve_model
    try:
        with terminated_cleanly():  # a first use converts
            return resolve_model(model if model not in DEFAULT_NAMES else None, dtype, quant, progress=True)
    except (ModelSerializerException, ValueError, OSError) as e:
        raise CliError(str(e), CONFIG_ERROR) from None


def check_ranks(tp, threads=0) -> None:
    """--tp within what this machine's NUMA nodes (or the DASHINFER_NUMA_NODES override) offer, and
    --threads within each rank's node (said here: the spawned launcher's refusal would come back
    as its exit code only)."""
    from dashinfer_server import topology
    if tp < 1:
        raise CliError(f"--tp {tp}: needs at least 1 rank", CONFIG_ERROR)
    if tp == 1:
        return
    try:
        nodes = topology.numa_nodes()
    except topology.PlacementError as e:
        raise CliError(str(e), CONFIG_ERROR) from None
    if tp > len(nodes):
        raise CliError(f"--tp {tp}: this machine has {len(nodes)} NUMA node(s), one rank each "
                       f"(DASHINFER_NUMA_NODES simulates more)", CONFIG_ERROR)
    try:
        for rank in range(tp):
            topology.plan_placement(rank, tp, threads or None)
    except topology.PlacementError as e:
        raise CliError(f"--threads {threads}: {e}" if threads else str(e), CONFIG_ERROR) from None

