"""Settings and fixtures every test module shares. Test modules import helper functions by name
(`from tests.helpers import ...`, `tests.engine_helpers`, `tests.http_server`), never fixtures.

Markers: `slow` is every test that starts a process (a rank group, a server, the CLI, a child
Python), marked at collection (`pytest_collection_modifyitems`), and every case that took over
SLOW_S seconds in a whole run (tests/slow_cases.txt, written by `pytest --record-slow`); `pytest -m
"not slow"` is the fast subset to run while working. The session fails if the run leaves files in /tmp or /dev/shm."""
import functools
import glob
import inspect
import os
import re
import sys
import time

# Cache bytecode even where PYTHONDONTWRITEBYTECODE is set: otherwise every collection rewrites
# each test module's asserts again, and each of the suite's child Pythons compiles the package again
# (the __pycache__ folders are gitignored).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import pytest

import dashinfer_client as allspark
from dashinfer_server import kernels as K
from tests.engine_helpers import API_CONTEXT, API_MAX_BATCH
from tests.helpers import build_tiny_model
from tests.http_server import API_KEY, MAX_MODEL_LEN, Reference, default_model_dir, serving

# the configured thread count throughout, so runs compare bit for bit (cpu_share.py)
os.environ.setdefault("DASHINFER_ADAPTIVE_THREADS", "0")
K.load()  # tests run where pytest started: nothing to place first

_ORDER = ("portable", "avx2", "avx512")
# Every kernel path this CPU can run: tests cover all of them on one machine.
ISAS = _ORDER[: _ORDER.index(K.supported_isa()) + 1]


# ---- the slow marker -------------------------------------------------------------------------------

# What starts a process, in a test's code, its fixtures' code or the module-level helpers they call.
_STARTS_A_PROCESS = re.compile(r"subprocess\.|Popen\(|ClientEngine\(|pexpect\.|\bServer\(|sys\.executable|"
                               r"mpiexec|SpawnedServer|launch_group\(|start_group\(|\bserving\(")
_CALLED = re.compile(r"\b([A-Za-z_]\w*)\(")


@functools.lru_cache(maxsize=None)  # parametrized cases share a function: collection was a minute of getsource
def _code(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _starts_a_process(item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(isinstance(v, str) and v == "client" for v in callspec.params.values()):
        # the ClientEngine side of api_engine (and of tests parametrized the same way)
        return True
    functions = [item.function]
    for name, defs in item._fixtureinfo.name2fixturedefs.items():
        if name != "api_engine":  # decided by its parameter above
            functions += [d.func for d in defs]
    sources = [_code(f) for f in functions]
    module = vars(item.module)
    for source in list(sources):  # one level of the test module's own helpers
        for called in set(_CALLED.findall(source)):
            helper = module.get(called)
            if inspect.isfunction(helper) and helper.__module__ == item.module.__name__:
                sources.append(_code(helper))
    return any(_STARTS_A_PROCESS.search(source) for source in sources)


# Cases that start no process but took over SLOW_S seconds (setup + call + teardown) in a whole run,
# listed with their seconds in SLOW_CASES; `pytest --record-slow` rewrites it from the run it ends.
SLOW_S = 0.5
SLOW_CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_cases.txt")


def _recorded_slow() -> dict:
    """nodeid -> seconds, as SLOW_CASES lists them."""
    try:
        with open(SLOW_CASES) as f:
            rows = [line.split(None, 1) for line in f if line.strip() and not line.startswith("#")]
    except FileNotFoundError:
        return {}
    return {nodeid.strip(): float(seconds) for seconds, nodeid in rows}


def pytest_addoption(parser):
    parser.addoption("--record-slow", action="store_true",
                     help=f"rewrite tests/slow_cases.txt: the cases this run measured over {SLOW_S} s that start "
                          f"no process (run it on the whole suite, on a machine as quiet as you can find)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts a process (a rank group, a server, the CLI, a child Python), "
                                       f"or took over {SLOW_S} s (tests/slow_cases.txt); deselect with -m 'not slow'")


_durations = {}     # nodeid -> seconds of this run (setup + call + teardown)
_by_process = set()  # nodeids slow because they start a process


def pytest_collection_modifyitems(config, items):
    recorded = _recorded_slow()
    for item in items:
        if isinstance(item, pytest.Function) and _starts_a_process(item):
            _by_process.add(item.nodeid)
        if item.nodeid in _by_process or item.nodeid in recorded:
            item.add_marker(pytest.mark.slow)


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    if not session.config.getoption("--record-slow"):
        return
    # cases this run did not measure (deselected, or in files it did not collect) keep their line
    seconds = {nodeid: s for nodeid, s in _recorded_slow().items() if nodeid not in _durations}
    seconds.update({nodeid: s for nodeid, s in _durations.items() if s > SLOW_S and nodeid not in _by_process})
    with open(SLOW_CASES, "w") as f:
        f.write(f"# seconds nodeid: the cases over {SLOW_S} s that start no process (pytest --record-slow)\n")
        f.writelines(f"{seconds[nodeid]:.2f} {nodeid}\n" for nodeid in sorted(seconds))


# ---- nothing left behind ---------------------------------------------------------------------------

# Files a run may leave by mistake: MPICH's mpiexec (hydra) writes its hwloc topology to
# /tmp/hydra_hwloc_xmlfile_* unless HWLOC_XMLFILE is set (launch.mpiexec_env: a killed mpiexec
# would leave it), the ranks'
# shared memory (ours dashinfer-*, MPICH's mpich_sh*), the gRPC services' unix sockets.
LEFTOVER_PATTERNS = ("/tmp/hydra_hwloc_xmlfile_*", "/tmp/dashinfer-*/*.sock", "/dev/shm/dashinfer-*",
                     "/dev/shm/mpich_sh*")
LEFTOVER_GRACE_S = 10.0  # processes stopped by the last tests may still be removing theirs


def _leftover_candidates() -> set:
    return {path for pattern in LEFTOVER_PATTERNS for path in glob.glob(pattern)}


def _alive(pid) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _in_use(paths) -> set:
    """The paths a live process may still own (another suite on this machine runs at the same
    time): a socket or segment named after a live pid, a mapped MPICH segment, a hydra topology
    file while an mpiexec runs."""
    from dashinfer_server.launch import mapped_mpich_segments
    mapped = mapped_mpich_segments() if any("mpich_sh" in p for p in paths) else set()
    mpiexec_runs = any(_read(comm).strip().startswith("mpiexec") for comm in glob.glob("/proc/[0-9]*/comm"))
    used = set()
    for path in paths:
        name = os.path.basename(path)
        pid = re.match(r"dashinfer-(?:\d+-)?(\d+)[-.]", name) if name.startswith("dashinfer-") else None
        if (pid and _alive(int(pid.group(1)))) or path in mapped or (name.startswith("hydra_") and mpiexec_runs):
            used.add(path)
    return used


def _read(path) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


@pytest.fixture(scope="session", autouse=True)
def leaves_nothing_behind():
    """Fails the session when files matching LEFTOVER_PATTERNS appeared during it and stay with no
    live process that may own them."""
    before = _leftover_candidates()
    yield
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := _leftover_candidates() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    left -= _in_use(left)
    assert not left, f"the test run left these files behind: {sorted(left)}"


@pytest.fixture(params=ISAS)
def isa(request):
    """Run the test on one kernel path, then restore the best one."""
    K.set_isa(request.param)
    yield request.param
    K.set_isa(K.supported_isa())


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """tiny_checkpoint(arch, **config) -> directory of a random fp32 Hugging Face model, built once
    per session and configuration."""
    built = {}

    def get(arch="llama", **config):
        key = (arch, tuple(sorted(config.items())))
        if key not in built:
            out = tmp_path_factory.mktemp(f"tiny-{arch}")
            built[key] = build_tiny_model(str(out / "hf"), arch=arch, dtype="float32", **config)
        return built[key]
    return get


@pytest.fixture(scope="session")
def serialized_tiny(tiny_checkpoint):
    """serialized_tiny(arch, name=None, **config) -> a HuggingFaceModel loader whose model is
    serialized (float32 weights) beside its checkpoint as `name` (default tiny-{arch}), once per
    configuration: its files are {loader.model_output_dir}/{loader.serialize_model_name}.*"""
    loaders = {}

    def get(arch="llama", name=None, **config):
        name = name or f"tiny-{arch}"
        key = (arch, name, tuple(sorted(config.items())))
        if key not in loaders:
            hf_dir = tiny_checkpoint(arch, **config)
            loader = allspark.HuggingFaceModel(hf_dir, name, user_set_data_type="float32", progress=False)
            loader.load_model().read_model_config().serialize_to_path(
                None, os.path.join(os.path.dirname(hf_dir), f"serialized-{name}")).free_model()
            loaders[key] = loader
        return loaders[key]
    return get


@pytest.fixture(scope="session")
def tiny_model(serialized_tiny):
    """The directory of a serialized tiny LLaMA named "tiny", context 4096 (4 * MAX_MODEL_LEN): the
    model of the `dashinfer serve`, gRPC service and ClientEngine tests."""
    return serialized_tiny(name="tiny", max_position_embeddings=4 * MAX_MODEL_LEN).model_output_dir


@pytest.fixture(scope="module")
def tiny_reference(tiny_model):
    """tiny_model in this process (Engine, one rank): what `dashinfer serve` and chat must answer."""
    reference = Reference(tiny_model)
    yield reference
    reference.close()


@pytest.fixture(scope="module")
def tiny_engine(tiny_model):
    """An in-process Engine serving tiny_model as "tiny" (max_length 4096, max_batch 2): the engine
    behind the gRPC service tests' servers."""
    from dashinfer_server.engine import Engine
    engine = Engine()
    cfg = (allspark.AsModelRuntimeConfigBuilder().model_name("tiny").model_dir(tiny_model, "tiny")
           .max_length(4096).max_batch(2).build())
    assert engine.install_model(cfg) == 0 and engine.start_model("tiny") == 0
    yield engine
    engine.release_model("tiny")


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    """`dashinfer serve` of the default model on one rank behind API_KEY (each module its own)."""
    with serving(default_model_dir(), str(tmp_path_factory.mktemp("serve") / "serve.log"), "--api-key", API_KEY,
                 tp=1) as s:
        yield s


def _make_engine(kind):
    if kind == "engine":
        return allspark.Engine()
    if kind == "client":
        return allspark.ClientEngine(startup_timeout=120)
    raise ValueError(f"unknown engine kind {kind!r}")


# in-process, and ClientEngine over gRPC to a spawned server
@pytest.fixture(scope="module", params=["engine", "client"])
def api_engine(request, serialized_tiny):
    """(engine, model_name, loader): a tiny LLaMA (fp32 weights, context 8192) installed and
    started with max_batch 16 and max_length 512. The model-independent API tests are written
    against it and the public API only, so they run unchanged against both engines. Tests may
    install more models from `loader` (loader.create_reference_runtime_config_builder)."""
    loader = serialized_tiny("llama", max_position_embeddings=API_CONTEXT)
    engine = _make_engine(request.param)
    name = "tiny-api"
    cfg = (loader.create_reference_runtime_config_builder(name, allspark.TargetDevice.CPU, [0],
                                                          max_batch=API_MAX_BATCH)
           .max_length(512).kv_cache_span_size(16).build())
    assert engine.install_model(cfg) == allspark.AsStatus.ALLSPARK_SUCCESS
    assert engine.start_model(name) == allspark.AsStatus.ALLSPARK_SUCCESS
    yield engine, name, loader
    engine.release_model(name)
    if request.param == "client":
        engine.close()


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    """A tiny random LLaMA checkpoint (safetensors, fp32) shared by the conversion tests."""
    return build_tiny_model(tmp_path_factory.mktemp("llama"), arch="llama")
