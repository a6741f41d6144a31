"""The launcher's command line, its shell wrapper, the systemd unit and its env file."""
import mmap
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from dashinfer_server import launch as L
from dashinfer_server import topology as T

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "launch")
SIM = {"DASHINFER_NUMA_NODES": "0:0;1:1"}


def command(argv, env, numactl=""):
    args, rest = L.parse_args(argv, env)
    return L.build_command(args, rest, env=env, numactl=numactl)


def rank_blocks(cmd):
    blocks, cur = [], []
    for a in cmd[1:]:
        if a == ":":
            blocks.append(cur)
            cur = []
        else:
            cur.append(a)
    return blocks + [cur]


def test_two_nodes_one_rank_each_with_its_environment():
    cmd, extra = command(["--address", "127.0.0.1:5555", "--model-dir", "/m", "--model-prefix", "p",
                          "--model-name", "qwen", "--some-rank-flag", "x"], SIM)
    # hydra writes no topology file that a killed mpiexec would leave; a user's own is kept
    assert extra == {"HWLOC_XMLFILE": ""}
    assert command(["--address", "127.0.0.1:5555"], dict(SIM, HWLOC_XMLFILE="/etc/topo.xml"))[1] == {}
    assert cmd[0] == os.path.join(os.path.dirname(sys.executable), "mpiexec")
    blocks = rank_blocks(cmd)
    assert len(blocks) == 2
    for node, block in enumerate(blocks):
        assert block[:2] == ["-n", "1"]
        envs = dict(zip(block[3::3][:2], block[4::3][:2]))
        assert [block[i] for i in range(2, 8, 3)] == ["-env"] * 2
        assert envs == {"DASHINFER_NODE": str(node), "OMP_NUM_THREADS": "1"}
        argv = block[8:]
        assert argv == [sys.executable, "-m", "dashinfer_server", "--address", "127.0.0.1:5555",
                        "--model-dir", "/m", "--model-prefix", "p", "--model-name", "qwen",
                        "--some-rank-flag", "x"]


def test_flags_default_from_the_environment():
    env = dict(SIM, DASHINFER_NODES="1", DASHINFER_THREADS_PER_RANK="1", DASHINFER_ADDRESS="unix:///run/x.sock",
               DASHINFER_MODEL_DIR="/models", DASHINFER_LOG_LEVEL="DEBUG", DASHINFER_LOG_FORMAT="json")
    cmd, extra = command([], env)
    # one rank: no mpiexec, the rank's placement goes in its environment
    assert cmd == [sys.executable, "-m", "dashinfer_server", "--address", "unix:///run/x.sock",
                   "--threads", "1", "--model-dir", "/models", "--log-level", "DEBUG", "--log-format", "json"]
    assert extra["DASHINFER_NODE"] == "0" and extra["OMP_NUM_THREADS"] == "1"


def test_default_address_is_a_private_unix_socket(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert L.default_address() == f"unix://{tmp_path}/dashinfer-{os.getuid()}-{os.getpid()}.sock"
    own = f"{tempfile.gettempdir()}/dashinfer-{os.getuid()}"  # this user's private directory
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/nonexistent/run")  # not there: the private directory
    assert L.default_address() == f"unix://{own}/dashinfer-{os.getuid()}-{os.getpid()}.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    cmd, _ = command([], dict(SIM))
    address = cmd[cmd.index("--address") + 1]
    assert re.fullmatch(rf"unix://{own}/dashinfer-{os.getuid()}-\d+\.sock", address)


def test_numactl_binds_cpus_and_only_real_memory():
    cmd, _ = command([], SIM, numactl="/usr/bin/numactl")
    b0, b1 = rank_blocks(cmd)
    assert b0[8:11] == ["/usr/bin/numactl", "--physcpubind=0", "--membind=0"]
    assert b1[8:10] == ["/usr/bin/numactl", "--physcpubind=1"] and b1[10] == sys.executable


def test_impossible_launches_fail_before_starting(capsys):
    with pytest.raises(T.PlacementError, match="--nodes 3"):
        command(["--nodes", "3"], SIM)
    with pytest.raises(T.PlacementError, match="threads do not fit"):
        command(["--threads-per-rank", "2"], SIM)
    assert L.main(["--nodes", "64", "--dry-run"]) == 78  # EX_CONFIG: systemd does not restart it
    assert "this machine has" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--nodes", "--threads-per-rank", "--first-node"])
def test_a_negative_count_is_a_usage_error_as_in_the_environment(flag, capsys, monkeypatch):
    """--nodes -1 planned no rank at all and ran `mpiexec` alone; DASHINFER_NODES=-1 was refused."""
    monkeypatch.setenv("DASHINFER_NUMA_NODES", SIM["DASHINFER_NUMA_NODES"])
    with pytest.raises(SystemExit) as e:
        L.main([flag, "-1", "--dry-run"])
    assert e.value.code == 78
    assert f"argument {flag}: '-1': expected an integer >= 0" in capsys.readouterr().err


def test_shell_wrapper_runs_the_launcher():
    env = dict(os.environ, **SIM, DASHINFER_PYTHON=sys.executable,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([os.path.join(LAUNCH, "dashinfer-launch"), "--dry-run", "--address", "127.0.0.1:1"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    assert out.stdout.strip().startswith(f"HWLOC_XMLFILE= {mpiexec} -n 1"), out.stdout
    assert out.stdout.count("-m dashinfer_server --address 127.0.0.1:1") == 2


UNITS = ("dashinfer.service", "dashinfer-http.service")
# Settings whose absence systemd-analyze security weighs most: without them a unit is rated unsafe.
HARDENING = ("User=", "Group=", "NoNewPrivileges=", "ProtectSystem=", "ProtectHome=", "PrivateTmp=",
             "PrivateDevices=", "PrivateUsers=", "ProtectKernel", "ProtectControlGroups=", "ProtectClock=",
             "ProtectHostname=", "ProtectProc=", "Restrict", "LockPersonality=", "CapabilityBoundingSet=",
             "AmbientCapabilities=", "SystemCallFilter=", "SystemCallArchitectures=", "KeyringMode=",
             "RemoveIPC=", "IPAddress", "UMask=")


def unit_text(name):
    return open(os.path.join(LAUNCH, name)).read()


def installed_unit(tmp_path, name="dashinfer.service", text=None):
    """The unit with /opt/dashinfer paths pointing into this checkout (and, for the HTTP unit, the
    `dashinfer` console script replaced by an executable stand-in: verify checks ExecStart exists)."""
    text = text or unit_text(name)
    stand_in = tmp_path / "dashinfer"
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    unit = tmp_path / name
    unit.write_text(text.replace("/opt/dashinfer/launch", LAUNCH).replace("/opt/dashinfer/venv/bin/dashinfer",
                                                                          str(stand_in)))
    return unit


def analyze(*args):
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is missing: apt-get install -y systemd"
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)


def exposure(unit) -> float:
    done = analyze("security", "--offline=true", "--no-pager", str(unit))
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout + done.stderr)
    assert found, done.stdout + done.stderr
    return float(found.group(1))


@pytest.mark.parametrize("name", UNITS)
def test_systemd_unit_verifies(tmp_path, name):
    text = unit_text(name)
    for line in ("Type=notify", "Restart=on-failure", "RestartPreventExitStatus=78", "KillSignal=SIGTERM",
                 "KillMode=mixed", "User=dashinfer", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "ProtectHome=yes", "PrivateTmp=yes", "CacheDirectory=dashinfer"):
        assert line in text.splitlines(), line
    assert re.search(r"^TimeoutStopSec=\d+$", text, re.M) and re.search(r"^RuntimeDirectory=\S+$", text, re.M)
    env_file = re.search(r"^EnvironmentFile=/opt/dashinfer/launch/(\S+)$", text, re.M).group(1)
    assert os.path.isfile(os.path.join(LAUNCH, env_file))
    done = analyze("verify", str(installed_unit(tmp_path, name)))
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    # the check can fail: a bad value is reported (systemd-analyze warns and exits 0 for some)
    broken = analyze("verify", str(installed_unit(tmp_path, name, text.replace("Restart=on-failure", "Restart=sometimes"))))
    assert broken.returncode != 0 or "restart" in broken.stderr


def test_grpc_unit_runs_the_launcher_and_takes_the_ranks_notifications():
    lines = unit_text("dashinfer.service").splitlines()
    assert "ExecStart=/opt/dashinfer/launch/dashinfer-launch" in lines
    assert "NotifyAccess=all" in lines  # rank 0, which says READY=1, is a child of mpiexec
    assert "RuntimeDirectory=dashinfer" in lines  # the default DASHINFER_ADDRESS lives there
    assert "DASHINFER_ADDRESS=unix:///run/dashinfer/dashinfer.sock" in unit_text("dashinfer.env").splitlines()


def test_http_unit_runs_dashinfer_serve_with_the_env_file_settings():
    text = unit_text("dashinfer-http.service")
    command = re.search(r"^ExecStart=(.*)$", text, re.M).group(1).split()
    assert command[:3] == ["/opt/dashinfer/venv/bin/dashinfer", "serve", "${DASHINFER_MODEL}"]
    flags = dict(zip(command[3:-1:2], command[4:-1:2]))
    assert flags == {"--tp": "${DASHINFER_TP}", "--host": "${DASHINFER_HOST}", "--port": "${DASHINFER_PORT}"}
    assert command[-1] == "$DASHINFER_SERVE_ARGS"  # unbraced: split into words, none when empty
    assert "NotifyAccess=main" in text.splitlines()  # the ranks `serve` spawns do not speak for it
    env = dict(re.findall(r"^(DASHINFER_\w+)=(.*)$", unit_text("dashinfer-http.env"), re.M))
    assert env["DASHINFER_HOST"] == "127.0.0.1" and env["DASHINFER_PORT"] == "8000"


@pytest.mark.parametrize("name", UNITS)
def test_systemd_unit_exposure_is_at_most_4(tmp_path, name):
    assert exposure(installed_unit(tmp_path, name)) <= 4.0
    # the check can fail: the same unit without its hardening is rated far worse
    bare = "\n".join(line for line in unit_text(name).splitlines() if not line.startswith(HARDENING))
    assert exposure(installed_unit(tmp_path, name, bare)) > 4.0


@pytest.mark.parametrize("env_file", ["dashinfer.env", "dashinfer-http.env"])
def test_env_file_documents_only_variables_the_code_reads(env_file):
    names = re.findall(r"^#?\s*(DASHINFER_\w+)=", open(os.path.join(LAUNCH, env_file)).read(), re.M)
    assert len(names) >= 5
    sources = ""
    for d in ("dashinfer_server", "dashinfer_client", "launch"):
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                if f.endswith((".py", "-launch", ".service")):
                    sources += open(os.path.join(base, f)).read()
    unread = [n for n in names if n not in sources]
    assert not unread, f"{env_file} documents variables nothing reads: {unread}"


def test_sweep_removes_only_unmapped_old_mpich_segments(tmp_path):
    old, young, mapped = (tmp_path / n for n in ("mpich_shar_tmpAb12Cd", "mpich_shm_bb_0", "mpich_shm_cc_0"))
    for p in (old, young, mapped):
        p.write_bytes(b"\0" * 4096)
    long_ago = time.time() - 3600
    os.utime(old, (long_ago, long_ago))
    os.utime(mapped, (long_ago, long_ago))
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096) as m:
        m[0] = 1
        removed = L.sweep_stale_mpich_segments(str(tmp_path), min_age_s=60)
    assert removed == [str(old)]
    assert not old.exists() and young.exists() and mapped.exists()
