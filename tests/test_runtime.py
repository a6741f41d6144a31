import os
import subprocess
import sys

import numpy as np
import pytest

from dashinfer_server import kernels as K
from dashinfer_client.dtypes import from_bf16, to_bf16


def test_isa_paths_switch_and_restore(isa):
    assert K.isa() == isa


def test_unknown_or_unsupported_isa_is_refused():
    with pytest.raises(ValueError, match="unknown path"):
        K.set_isa("sse9")
    assert K.isa() == K.supported_isa()


def test_env_caps_the_path():
    code = "from dashinfer_server import kernels as K; K.load(); print(K.isa())"
    env = dict(os.environ, DASHINFER_ISA="portable")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "portable"


def test_kernels_load_only_when_asked():
    """Importing the server (every module, __main__ included) loads no kernels, so a rank can
    place itself first; a kernel used before load() says so; load() is idempotent."""
    code = ("import sys\n"
            "import dashinfer_server.__main__, dashinfer_server.engine\n"
            "from dashinfer_server import kernels as K\n"
            "print('dashinfer_server._native' in sys.modules)\n"
            "try:\n    K.linear\nexcept K.KernelsNotLoaded as e:\n    print(e)\n"
            "print(K.load() is K.load() is K, K.loaded(), K.num_threads() >= 1)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "False"
    assert "dashinfer_server.kernels.linear used before kernels.load()" in lines[1]
    assert lines[2] == "True True True"
    with pytest.raises(AttributeError, match="no attribute 'no_such_kernel'"):
        K.no_such_kernel


def test_thread_count_is_checked():
    before = K.num_threads()
    K.set_num_threads(1)
    assert K.num_threads() == 1
    K.set_num_threads(before)
    with pytest.raises(ValueError):
        K.set_num_threads(0)


def test_bf16_rounding_matches_torch():
    import torch

    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 1e3
    x[:4] = [np.inf, -np.inf, np.nan, 0.0]
    ref = torch.from_numpy(x).bfloat16().view(torch.int16).numpy().view(np.uint16)
    ours = to_bf16(x)
    assert np.array_equal(ours[3:], ref[3:]) and np.array_equal(ours[:2], ref[:2])
    assert np.isnan(from_bf16(ours[2:3]))[0]
    assert np.array_equal(from_bf16(ref[3:]), torch.from_numpy(ref[3:].view(np.int16)).view(
        torch.bfloat16).float().numpy())


def test_kernels_of_every_size_keep_the_same_openmp_threads():
    """A decode step mixes wide kernels, narrow ones (a k/v projection of a few panels) and small
    ones: libgomp ends the threads a smaller team leaves out and starts new ones for the next
    larger team, so the kernels fork one thread or all of them, never a count in between. The
    process's thread ids must not change over such a sequence."""
    from tests.helpers import kernel_threads
    from tests.test_linear import make_weight
    rng = np.random.default_rng(0)
    wide, narrow = make_weight("bf16", 1024, 1536, 0, rng)[0], make_weight("bf16", 128, 1536, 0, rng)[0]
    x = rng.standard_normal((1, 1536)).astype(np.float32)
    rows = rng.standard_normal((3, 1536)).astype(np.float32)
    gate_up = rng.standard_normal((1, 2 * 4500)).astype(np.float32)

    def step():
        """the thread ids seen after each kernel"""
        seen = set()
        for call in (lambda: K.linear(x, wide), lambda: K.linear(x, narrow),  # narrow: 2 units of work
                     lambda: K.linear(rows, narrow), lambda: K.glu_mul(gate_up, np.empty((1, 4500), np.float32)),
                     lambda: K.rms_norm(rows, np.ones(1536, np.float32), 1e-6, np.empty_like(rows))):
            call()
            seen |= set(os.listdir("/proc/self/task"))
        return seen

    with kernel_threads(4):
        step()  # a pool left larger by an earlier test shrinks to the team here, once
        first = step()
        for _ in range(20):
            assert step() == first
