"""Run under mpiexec -n N by tests/test_parallel.py: the collectives of MPIGroup against numpy.

Prints one line "OK <allreduce kind>" on rank 0 when every check passed; any failure raises
(and mpiexec tears the group down with a non-zero exit). RAISE_ON_RANK=r makes rank r raise
while the others wait for it in a collective."""
import os
import sys
import time

import numpy as np

from dashinfer_server import kernels
from dashinfer_server.parallel import MPIGroup
from dashinfer_server.plan import StepPlan
from dashinfer_server.shard import split_range

SIZES = (1, 7, 576, 1001, 4096, 65536 + 3, (1 << 18) + 17, 3 * (1 << 18) + 5)


def rank_vector(r: int, n: int) -> np.ndarray:
    return np.random.default_rng(1000 + r).standard_normal(n).astype(np.float32)


def check_allreduce(g) -> None:
    for n in SIZES:
        for shape in ((n,), (1, n)) if n < 1000 else ((n,),):
            x = rank_vector(g.rank, n).reshape(shape)
            g.allreduce_(x)
            want = sum(rank_vector(r, n).astype(np.float64) for r in range(g.world))
            np.testing.assert_allclose(x.reshape(-1), want, rtol=1e-5, atol=1e-5, err_msg=f"n={n}")
            # every rank holds the same bits
            everyone = g.comm.allgather(x.tobytes())
            assert all(b == everyone[0] for b in everyone), f"ranks disagree for n={n}"
    x = np.zeros(0, np.float32)
    g.allreduce_(x)
    check_waits(g)


def check_waits(g) -> None:
    """The shared-memory group counts its waits for peers (bench/tp_steps.py reads them): a rank
    that arrives 50 ms before the others has waited about that long."""
    if g.allreduce_kind != "shm":
        return
    comm = g.native_allreduce()[0]
    waits, seconds = kernels.comm_waits(comm)
    assert waits >= len(SIZES) and seconds >= 0, (waits, seconds)
    if g.rank:
        time.sleep(0.05)
    g.allreduce_(np.ones(8, np.float32))
    waits2, seconds2 = kernels.comm_waits(comm)
    assert waits2 == waits + 1, (waits, waits2)
    if g.rank == 0:
        assert 0.04 < seconds2 - seconds < 5, seconds2 - seconds


def plan_of(step: int) -> StepPlan:
    rng = np.random.default_rng(step)
    b = int(rng.integers(1, 40))
    counts = rng.integers(1, 9 if step % 2 else 400, b)
    t = int(counts.sum())
    q = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    i32 = lambda a: np.asarray(a, np.int32)  # noqa: E731
    return StepPlan(i32(rng.integers(0, 50000, t)), i32(rng.integers(0, 4000, t)),
                    i32(rng.integers(0, 10**6, t)), q, i32(rng.integers(1, 4000, b)),
                    i32(rng.integers(0, 5000, (b, int(rng.integers(1, 70))))), i32(q[1:] - 1))


def check_plans(g) -> None:
    for step in range(6):
        want = plan_of(step)
        name = f"model-{step}-é"
        a, b = split_range(2 * g.world, g.rank, g.world)
        logits = np.zeros((0, b - a), np.float32), np.zeros((0, 2 * g.world), np.float32)
        if g.rank == 0:
            g.step(name, want)
            g.gather_vocab(*logits)
        else:
            kind, got_name, got = g.receive()
            assert (kind, got_name) == ("step", name), (kind, got_name)
            for a, b in zip(want.arrays(), got.arrays()):
                assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
            g.gather_vocab(*logits)


def check_gather_vocab(g) -> None:
    for s, vocab in ((1, 49152), (3, 101), (32, 1000), (2, g.world), (40, 49152), (2, 600001)):
        a, b = split_range(vocab, g.rank, g.world)
        full = np.arange(s * vocab, dtype=np.float32).reshape(s, vocab)
        local = np.ascontiguousarray(full[:, a:b])
        if g.rank == 0:
            g._step_open, _ = True, g._lock.acquire()
            out = np.full((s, vocab), -1, np.float32)
            g.gather_vocab(local, out)
            assert np.array_equal(out, full), f"gather_vocab s={s} vocab={vocab}"
        else:
            g.gather_vocab(local, np.zeros((s, vocab), np.float32))


def check_commands(g) -> None:
    if g.rank == 0:
        g.command("ping", {"x": [1, 2], "s": "é"})
        try:
            g.command("fail", {"why": "asked to"})
        except RuntimeError as e:
            assert "rank 1" in str(e) and "asked to" in str(e), e
        else:
            raise AssertionError("a failing worker did not raise on rank 0")
        g.close()
    else:
        assert g.receive() == ("command", "ping", {"x": [1, 2], "s": "é"})
        g.reply(None)
        _, _, payload = g.receive()
        g.reply(payload["why"])
        assert g.receive() == ("shutdown",)


def main() -> None:
    kernels.load()  # the shared-memory allreduce is native (no placement here: not timed)
    g = MPIGroup.init()
    if os.environ.get("RAISE_ON_RANK") == str(g.rank):
        raise RuntimeError(f"rank {g.rank} fails before its first allreduce")
    check_allreduce(g)
    check_plans(g)
    check_gather_vocab(g)
    check_commands(g)
    if g.rank == 0:
        print("OK", g.allreduce_kind, flush=True)


if __name__ == "__main__":
    sys.exit(main())
