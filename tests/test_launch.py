"""The launcher's command line, its shell wrapper, the systemd unit and its env file."""
import mmap
import os
import re
import shutil
import subprocess
import sys
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
    assert extra == {}
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


def test_default_address_is_a_private_unix_socket(monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert L.default_address() == f"unix:///run/user/1000/dashinfer-{os.getuid()}-{os.getpid()}.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    cmd, _ = command([], dict(SIM))
    address = cmd[cmd.index("--address") + 1]
    assert re.fullmatch(rf"unix:///tmp/dashinfer-{os.getuid()}-\d+\.sock", address)


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


def test_shell_wrapper_runs_the_launcher():
    env = dict(os.environ, **SIM, DASHINFER_PYTHON=sys.executable,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([os.path.join(LAUNCH, "dashinfer-launch"), "--dry-run", "--address", "127.0.0.1:1"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(os.path.join(os.path.dirname(sys.executable), "mpiexec") + " -n 1")
    assert out.stdout.count("-m dashinfer_server --address 127.0.0.1:1") == 2


def installed_unit(tmp_path, text=None):
    text = text or open(os.path.join(LAUNCH, "dashinfer.service")).read()
    unit = tmp_path / "dashinfer.service"
    unit.write_text(text.replace("/opt/dashinfer/launch", LAUNCH))
    return unit


def verify(unit):
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is missing: apt-get install -y systemd"
    return subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)


def test_systemd_unit_verifies(tmp_path):
    text = open(os.path.join(LAUNCH, "dashinfer.service")).read()
    for line in ("ExecStart=/opt/dashinfer/launch/dashinfer-launch", "Restart=on-failure",
                 "KillSignal=SIGTERM", "KillMode=mixed", "EnvironmentFile=/opt/dashinfer/launch/dashinfer.env"):
        assert line in text.splitlines()
    assert re.search(r"^TimeoutStopSec=\d+$", text, re.M)
    done = verify(installed_unit(tmp_path))
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    # the check can fail: a bad value is reported (systemd-analyze warns and exits 0 for some)
    broken = verify(installed_unit(tmp_path, text.replace("Restart=on-failure", "Restart=sometimes")))
    assert broken.returncode != 0 or "restart" in broken.stderr


def test_env_file_documents_only_variables_the_code_reads():
    names = re.findall(r"^#?\s*(DASHINFER_\w+)=", open(os.path.join(LAUNCH, "dashinfer.env")).read(), re.M)
    assert len(names) >= 10
    sources = ""
    for d in ("dashinfer_server", "launch"):
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                if f.endswith((".py", "-launch")):
                    sources += open(os.path.join(base, f)).read()
    unread = [n for n in names if n not in sources]
    assert not unread, f"dashinfer.env documents variables nothing reads: {unread}"


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
