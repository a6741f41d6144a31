"""The settings registry (dashinfer_client/settings.py) against the code that reads the variables and
against docs/deployment.md's table; one rule for a bad value, from `dashinfer serve` and Engine()."""
import os
import re

import pytest

from dashinfer_client import settings
from dashinfer_client.settings import REGISTRY, SettingError
from tests.test_cli import dashinfer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = r"\b(?:DASHINFER|AS)_[A-Z0-9_]*[A-Z0-9]\b"
# A read of a variable that bypasses the registry: os.environ.get("X"), env["X"], getenv("X"), ...
DIRECT_READ = re.compile(r"""(?:environ|env|getenv)\s*(?:\.get)?\s*[\(\[]\s*["'](?:DASHINFER|AS)_""")
DOC = os.path.join(ROOT, "docs", "deployment.md")

# one bad value per kind, and the line the registry must answer with
BAD = {"DASHINFER_MAX_WAIT_STEPS": ("soon", "an integer >= 0"),
       "DASHINFER_REQUEST_TIMEOUT": ("-1", "a number >= 0"),
       "DASHINFER_ADAPTIVE_THREADS": ("maybe", "1/true/yes/on or 0/false/no/off"),
       "DASHINFER_ALLREDUCE": ("nccl", "one of auto, shm, mpi"),
       "DASHINFER_NUMA_NODES": ("zero:0", "node:cpulist;... (e.g. 0:0-3;1:4-7)"),
       "DASHINFER_PORT": ("70000", "an integer >= 1 and <= 65535"),
       "DASHINFER_TOKEN": ("caf\u00e9", "printable ASCII without spaces")}


def sources():
    """(path, text) of every file that may read a variable: the packages, native/, bench/, the
    launch scripts and units, setup.py."""
    for d in ("dashinfer_client", "dashinfer_server", "dashinfer", "native", "bench", "launch"):
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                if f.endswith((".py", ".c", ".h", "-launch", ".service", ".env")):
                    path = os.path.join(base, f)
                    yield path, open(path, errors="replace").read()
    yield os.path.join(ROOT, "setup.py"), open(os.path.join(ROOT, "setup.py")).read()


def test_every_variable_named_in_the_code_is_declared_and_every_declared_one_is_used():
    named = set()
    for path, text in sources():
        if not path.endswith("settings.py"):
            named.update(re.findall(NAME, text))
    assert {"DASHINFER_NUMA_NODES", "DASHINFER_MODEL", "DASHINFER_BUILD_JOBS", "AS_PROFILE"} <= named
    assert not named - set(REGISTRY), f"read but not declared: {sorted(named - set(REGISTRY))}"
    assert not set(REGISTRY) - named, f"declared but nothing uses them: {sorted(set(REGISTRY) - named)}"


def test_no_reader_bypasses_the_registry():
    bypass = [f"{os.path.relpath(path, ROOT)}:{n + 1}" for path, text in sources()
              if not path.endswith("settings.py")
              for n, line in enumerate(text.splitlines()) if DIRECT_READ.search(line)
              and not re.search(r"\]\s*=|setdefault", line)]  # setting a child's variable is no read
    assert not bypass, f"reads that bypass dashinfer_client.settings: {bypass}"
    assert "getenv" not in "".join(t for p, t in sources() if p.endswith((".c", ".h")))


def test_the_deployment_table_is_the_registry():
    doc = open(DOC).read()
    assert settings.doc_table() in doc, "docs/deployment.md is stale: python -m dashinfer_client.settings --doc"
    table = doc[doc.index("## Environment variables"):]
    rows = {re.match(r"\| `(\w+)` \|", line).group(1): [c.strip() for c in line.split("|")[1:-1]]
            for line in table.splitlines() if re.match(r"\| `(DASHINFER|AS)_", line)}
    assert list(rows) == list(REGISTRY)
    for name, (_, read_by, doc_text, accepts, default) in rows.items():
        assert (read_by, doc_text, accepts) == (REGISTRY[name].read_by, REGISTRY[name].doc, REGISTRY[name].accepts())
        literal = re.fullmatch(r"`([^`]*)`", default)
        if literal and REGISTRY[name].default is not None:  # the table's default is the value an unset variable gets
            assert settings.get(name, {}) == REGISTRY[name].parse(literal.group(1))


def test_unset_or_empty_gives_the_default_the_table_states():
    from dashinfer_server.http.admission import MAX_WAITING
    from dashinfer_server.scheduler import max_wait_steps, prompt_step_tokens
    from dashinfer_server.sessions import stream_interval_s
    doc = open(DOC).read()

    def tabled(name):
        return re.search(rf"^\| `{name}` \|.*\| `([^`]*)`[^|]* \|$", doc, re.M).group(1)
    assert settings.get("DASHINFER_MAX_WAIT_STEPS", {"DASHINFER_MAX_WAIT_STEPS": " "}) == int(tabled("DASHINFER_MAX_WAIT_STEPS"))
    for var in ("DASHINFER_MAX_WAIT_STEPS", "DASHINFER_PROMPT_STEP_TOKENS", "DASHINFER_STREAM_INTERVAL_MS"):
        assert var not in os.environ
    assert max_wait_steps() == int(tabled("DASHINFER_MAX_WAIT_STEPS")) == 4
    assert prompt_step_tokens() == int(tabled("DASHINFER_PROMPT_STEP_TOKENS")) == 32
    assert stream_interval_s() == float(tabled("DASHINFER_STREAM_INTERVAL_MS")) / 1000 == 0.02
    assert MAX_WAITING == int(tabled("DASHINFER_MAX_WAITING")) == 128
    assert settings.get("DASHINFER_ALLREDUCE_TIMEOUT", {}) == 60.0
    assert settings.get("DASHINFER_ADAPTIVE_THREADS", {}) is True and settings.get("DASHINFER_QUIET", {}) is False
    assert settings.get("DASHINFER_TOKEN", {}) is None


@pytest.mark.parametrize("name", BAD)
def test_a_bad_value_of_each_kind_is_one_line_naming_the_variable(name):
    value, accepts = BAD[name]
    with pytest.raises(SettingError) as e:
        settings.check_environment({name: value})
    assert str(e.value) == f"{name}={value!r}: expected {accepts}"


def test_values_each_kind_accepts():
    assert settings.get("DASHINFER_ADAPTIVE_THREADS", {"DASHINFER_ADAPTIVE_THREADS": "Off"}) is False
    assert settings.get("DASHINFER_LOG_LEVEL", {"DASHINFER_LOG_LEVEL": "debug"}) == "DEBUG"
    assert settings.get("DASHINFER_REQUEST_TIMEOUT", {"DASHINFER_REQUEST_TIMEOUT": "2.5"}) == 2.5
    assert settings.get("DASHINFER_NUMA_NODES", {"DASHINFER_NUMA_NODES": "0:0-3;1:4,5"}) == "0:0-3;1:4,5"
    with pytest.raises(SettingError, match="expected a number"):
        settings.get("DASHINFER_REQUEST_TIMEOUT", {"DASHINFER_REQUEST_TIMEOUT": "nan"})


def test_engine_refuses_a_bad_value_at_construction(monkeypatch):
    from dashinfer_server.engine import Engine
    monkeypatch.setenv("DASHINFER_STREAM_INTERVAL_MS", "fast")
    with pytest.raises(SettingError, match=r"^DASHINFER_STREAM_INTERVAL_MS='fast': expected a number >= 0$"):
        Engine()


@pytest.mark.parametrize("name", ["DASHINFER_PROMPT_STEP_TOKENS", "DASHINFER_MEMBIND", "DASHINFER_QUIET"])
def test_dashinfer_serve_exits_78_with_one_line(name):
    value = {"DASHINFER_PROMPT_STEP_TOKENS": "1.5", "DASHINFER_MEMBIND": "strict", "DASHINFER_QUIET": "2"}[name]
    done = dashinfer("serve", "--port", "0", env={name: value})
    assert done.returncode == 78  # EX_CONFIG: systemd does not restart it
    assert done.stderr == f"dashinfer: {name}={value!r}: expected {REGISTRY[name].accepts()}\n"
