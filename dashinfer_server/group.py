"""The group of ranks a process belongs to, and joining it.

LocalGroup is the one process of the in-process Engine (TP=1); a rank of an mpiexec'd group
joins an MPIGroup (parallel.py). Joining follows the load-order rule of kernels.py: a rank first
binds itself to its NUMA node (topology.py), then loads the kernels.
"""
import os

from dashinfer_client import settings

from . import kernels as K
from . import topology
from .parallel import MPIGroup


class LocalGroup:
    """The trivial group of the in-process Engine (TP=1): every collective is the identity."""
    rank = 0
    world = 1

    def __init__(self):
        K.load()  # the in-process Engine runs where it was started: nothing to place first

    def command(self, name: str, payload: dict) -> None:
        """Rank 0 tells the other ranks to run an engine command (install_model, start_model,
        stop_model, release_model) on their shard; raises if one of them fails."""

    def step(self, model_name: str, plan) -> None:
        """Rank 0 hands the other ranks the next step's plan, before its own forward."""

    def step_failed(self, error: BaseException) -> None:
        """The forward of a step raised on rank 0 (between step() and gather_vocab())."""

    def allreduce_(self, x) -> None:
        """Sum `x` over the ranks, in place."""

    def native_allreduce(self):
        """(comm, timeout) for kernels that allreduce inside one native call (comm None: one
        rank, nothing to sum), or None when the sum needs Python (MPI)."""
        return None, 0.0

    def gather_vocab(self, local, out, last=True) -> None:
        """Assemble rank shards of logits [B, V_rank] into out [B, V] on rank 0 (last: the step's
        last gather, which ends it)."""
        if out is not local:
            out[...] = local

    def close(self) -> None:
        """Rank 0: let the other ranks exit."""


def launched_world() -> tuple[int, int]:
    """(rank, size) as the MPI launcher told this process through its environment; (0, 1) for
    a process not started by mpiexec. Read before importing mpi4py, so that a single process
    never loads MPI."""
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMIX_RANK", "PMIX_SIZE")):
        if size_var in os.environ:
            return int(os.environ.get(rank_var, 0)), int(os.environ[size_var])
    return 0, 1


def init_group(threads: int | None = None):
    """The group this process belongs to: LocalGroup for a single process, MPIGroup for a rank
    of an mpiexec'd group of several. A server calls it first: a rank binds itself to its NUMA
    node (dashinfer_server.topology) and sets its OpenMP placement, and only then loads the
    kernels, whose OpenMP runtime reads that placement when it loads.
    threads: OpenMP threads per rank (default: the cores of its node)."""
    rank, world = launched_world()
    if world <= 1 and settings.get("DASHINFER_NODE") is None:
        return LocalGroup()
    topology.place_rank(rank, world, threads)
    K.load()
    if world <= 1:
        return LocalGroup()
    return MPIGroup.init()
