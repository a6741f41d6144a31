"""The kernel thread count that follows the cores other processes leave (cpu_share.py)."""
import os
import types

import pytest

from dashinfer_server import cpu_share
from dashinfer_server import kernels as K
from tests.helpers import kernel_threads

STAT = """cpu  900 10 300 5000 40 5 6 7 0 0
cpu0 100 1 20 2500 4 1 2 3 0 0
cpu1 800 9 280 2500 36 4 4 4 0 0
intr 12345
"""


def test_busy_seconds_sums_the_busy_fields_of_the_given_cpus(tmp_path):
    path = tmp_path / "stat"
    path.write_text(STAT)
    hz = os.sysconf("SC_CLK_TCK")
    # user nice system irq softirq steal; idle and iowait are not busy
    assert cpu_share.busy_seconds([0], str(path)) == pytest.approx((100 + 1 + 20 + 1 + 2 + 3) / hz)
    assert cpu_share.busy_seconds([0, 1], str(path)) == pytest.approx(
        (127 + 800 + 9 + 280 + 4 + 4 + 4) / hz)
    assert cpu_share.busy_seconds([5], str(path)) == 0


@pytest.mark.parametrize("others, cpus, configured, threads", [
    (0.0, 2, 2, 2), (0.3, 2, 2, 2), (0.67, 2, 2, 1), (1.0, 2, 2, 1), (2.0, 2, 2, 1),
    (0.0, 8, 4, 4), (5.2, 8, 8, 3)])
def test_threads_are_the_free_cores_within_the_configured_count(others, cpus, configured, threads):
    assert cpu_share.threads_for(others, cpus, configured) == threads


class FakeHost:
    """A clock, this process's CPU time and the busy time of its cpus, advanced by hand."""

    def __init__(self, monkeypatch):
        self.wall = self.own = self.busy = 0.0
        clock = types.SimpleNamespace(perf_counter=lambda: self.wall, process_time=lambda: self.own)
        monkeypatch.setattr(cpu_share, "time", clock)
        monkeypatch.setattr(cpu_share, "busy_seconds", lambda cpus: self.busy)

    def run(self, seconds, own_cores, other_cores):
        self.wall += seconds
        self.own += seconds * own_cores
        self.busy += seconds * (own_cores + other_cores)


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setenv("DASHINFER_ADAPTIVE_THREADS", "1")
    with kernel_threads(2):
        yield


def test_a_busy_neighbour_takes_a_thread_and_gives_it_back(monkeypatch, two_threads):
    host = FakeHost(monkeypatch)
    share = cpu_share.CpuShare()
    share.cpus = [0, 1]
    share.adapt()  # the first look only starts the measure
    host.run(0.1, 1.33, 0.67)  # a busy loop gets its third of two cores
    share.adapt()  # before INTERVAL_S: no look
    assert K.num_threads() == 2
    host.run(0.2, 1.33, 0.67)
    share.adapt()
    assert K.num_threads() == 1
    host.run(0.3, 1.0, 1.0)  # it takes the core left to it: still one thread
    share.adapt()
    assert K.num_threads() == 1
    host.run(0.3, 1.0, 0.0)  # gone
    share.adapt()
    assert K.num_threads() == 2


def test_a_count_set_by_the_config_is_the_new_cap(monkeypatch, two_threads):
    host = FakeHost(monkeypatch)
    share = cpu_share.CpuShare()
    share.cpus = [0, 1]
    share.adapt()
    K.set_num_threads(1)  # apply_thread_num: thread_num 1
    host.run(0.3, 1.0, 0.0)
    share.adapt()
    assert K.num_threads() == 1 and share.configured == 1


def test_adaptive_threads_off_keeps_the_count(monkeypatch, two_threads):
    monkeypatch.setenv("DASHINFER_ADAPTIVE_THREADS", "0")
    host = FakeHost(monkeypatch)
    share = cpu_share.CpuShare()
    share.cpus = [0, 1]
    share.adapt()
    host.run(0.3, 1.0, 1.0)
    share.adapt()
    assert K.num_threads() == 2


def test_without_proc_stat_the_count_stays(monkeypatch, two_threads):
    def unreadable(cpus):
        raise FileNotFoundError("/proc/stat")
    monkeypatch.setattr(cpu_share, "busy_seconds", unreadable)
    share = cpu_share.CpuShare()
    share.adapt()
    share.adapt()
    assert not share.enabled and K.num_threads() == 2
