"""A model whose weights + KV cache and workspaces exceed what its rank's node can give is refused
before any weight is loaded, with both figures in one line; `dashinfer serve` and `dashinfer
convert` then exit 78. The limit is faked (DASHINFER_MEMORY_LIMIT_MB, or a patched probe), so no
big model is needed; the weight figure is checked against the .asparam as the safetensors library
reads it."""
import math
import os
import re

import pytest

from dashinfer_client import AsStatus, TargetDevice
from dashinfer_client.memory import available
from dashinfer_client.model import DashInferModel
from tests.test_cli import dashinfer
from tests.http_server import free_port


def _weights_in_file(model_dir, prefix):
    """Bytes of the tensors of the .asparam, read by the safetensors library, and of a tied head."""
    from safetensors import safe_open
    with safe_open(os.path.join(model_dir, prefix + ".asparam"), "np") as f:
        sizes = {name: f.get_tensor(name).nbytes for name in f.keys()}
    return sum(sizes.values()), sizes["model.embed_tokens.weight"]


@pytest.fixture(scope="module")
def moe_model(serialized_tiny):
    loader = serialized_tiny("qwen2_moe")
    return loader.model_output_dir, loader.serialize_model_name


def _install(model_dir, prefix, limit_mb, monkeypatch):
    from dashinfer_server.engine import Engine
    monkeypatch.setenv("DASHINFER_MEMORY_LIMIT_MB", str(limit_mb))
    model = DashInferModel(model_dir, prefix)
    builder = model.create_reference_runtime_config_builder("m", TargetDevice.CPU, [0], max_batch=2)
    engine = Engine()
    status = engine.install_model(builder.max_length(256).kv_cache_span_size(16).build())
    return engine, status


def test_a_model_over_the_limit_is_refused_with_both_figures(moe_model, monkeypatch):
    from dashinfer_server.memory_fit import weight_bytes
    model_dir, prefix = moe_model
    model = DashInferModel(model_dir, prefix)
    in_file, embedding = _weights_in_file(model_dir, prefix)
    tied = embedding if model.config.tie_word_embeddings else 0
    assert weight_bytes(model, 1) == in_file + tied  # one rank holds every tensor
    engine, status = _install(model_dir, prefix, 1, monkeypatch)  # 1 MiB: less than the weights alone
    assert status == AsStatus.ALLSPARK_MEMORY_ERROR
    line = engine.last_error
    assert "\n" not in line
    need, weights, have = (float(x) for x in re.search(
        r"needs ([\d.e-]+) GiB a rank \(weights ([\d.e-]+) GiB .* more than the ([\d.e-]+) GiB this machine", line).groups())
    assert math.isclose(weights, (in_file + tied) / 2**30, rel_tol=1e-2) and need > weights
    assert math.isclose(have, 1 / 1024, rel_tol=1e-2) and "DASHINFER_MEMORY_LIMIT_MB" in line
    engine, status = _install(model_dir, prefix, 1024, monkeypatch)  # 1 GiB: room for it
    assert status == AsStatus.ALLSPARK_SUCCESS, engine.last_error
    engine.release_model("m")


def test_ranks_sharing_a_machine_split_it(moe_model, monkeypatch):
    """Two ranks on simulated nodes (one machine's memory): each may take half."""
    from dashinfer_server.memory_fit import check_fits
    from dashinfer_client.refusals import Refused
    model_dir, prefix = moe_model
    model = DashInferModel(model_dir, prefix)
    cfg = model.create_reference_runtime_config_builder("m", TargetDevice.CPU, [0], max_batch=2) \
        .max_length(256).kv_cache_span_size(16).build()
    monkeypatch.setenv("DASHINFER_NUMA_NODES", "0:0;1:1")  # node 1 simulated: one machine's memory
    monkeypatch.setattr("dashinfer_client.memory.available", lambda node=None: (2 << 20, "a fake probe"))
    with pytest.raises(Refused, match=r"more than the 0.000977 GiB each of 2 ranks sharing this machine can "
                                      r"give \(a fake probe\)"):
        check_fits(cfg, model, 2)


def test_the_memory_limit_setting_is_each_ranks_own(moe_model, monkeypatch):
    """DASHINFER_MEMORY_LIMIT_MB is a rank's budget (docs/deployment.md), on simulated nodes as on
    real ones: 2 ranks are not given half of it each."""
    from dashinfer_server.memory_fit import check_fits
    from dashinfer_client.refusals import Refused
    model_dir, prefix = moe_model
    model = DashInferModel(model_dir, prefix)
    cfg = model.create_reference_runtime_config_builder("m", TargetDevice.CPU, [0], max_batch=2) \
        .max_length(256).kv_cache_span_size(16).build()
    monkeypatch.setenv("DASHINFER_NUMA_NODES", "0:0;1:1")
    monkeypatch.setenv("DASHINFER_MEMORY_LIMIT_MB", "1")
    with pytest.raises(Refused, match=r"more than the 0.000977 GiB each of 2 ranks can give \(DASHINFER_MEMORY_LIMIT_MB\)"):
        check_fits(cfg, model, 2)
    monkeypatch.setenv("DASHINFER_MEMORY_LIMIT_MB", "4096")
    check_fits(cfg, model, 2)  # a tiny model: fits in each rank's 4 GiB


def test_probe_reads_this_machine():
    have, where = available()
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert 0 < have <= total and where in ("MemAvailable", "the cgroup's memory limit")


def test_a_node_gives_its_free_memory_and_page_cache():
    path = "/sys/devices/system/node/node0/meminfo"
    if not os.path.exists(path):
        pytest.skip("no NUMA node in sysfs")
    have, where = available(0)
    with open(path) as f:
        total = next(int(line.split()[3]) * 1024 for line in f if line.split()[2] == "MemTotal:")
    assert 0 < have <= total and where == "node 0's free memory and page cache"


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_cgroup_limit_lowers_what_can_be_given(tmp_path, version):
    """limit - usage + the inactive page cache (what `docker stats` counts as free), read from a
    cgroup laid out as the kernel's v1 or v2 files are."""
    from dashinfer_client.memory import _CGROUPS, _cgroup_room
    v2, v1 = _CGROUPS
    marker, mount, limit_file, usage_file, cache_key = v2 if version == "v2" else v1
    folder = tmp_path / "mnt" / "job"
    folder.mkdir(parents=True)
    (folder / limit_file).write_text(str(1 << 30) + "\n")
    (folder / usage_file).write_text(str(600 << 20) + "\n")
    (folder / "memory.stat").write_text(f"cache 1\n{cache_key} {100 << 20}\nother 5\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n" if version == "v2" else "4:memory:/job\n1:cpu:/\n")
    table = ((marker, str(tmp_path / "mnt"), limit_file, usage_file, cache_key),)
    assert _cgroup_room(str(proc), table) == (1 << 30) - (600 << 20) + (100 << 20)
    (folder / limit_file).write_text("max\n" if version == "v2" else "9223372036854771712\n")
    assert _cgroup_room(str(proc), table) is None


def test_serve_exits_78_with_both_figures(moe_model):
    model_dir, prefix = moe_model
    done = dashinfer("serve", os.path.join(model_dir, prefix), "--port", str(free_port()),
                     env={"DASHINFER_MEMORY_LIMIT_MB": "1"})
    assert done.returncode == 78 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert re.search(r"cannot serve .* needs [\d.]+ GiB a rank \(weights [\d.]+ GiB .* more than the "
                     r"0.000977 GiB this machine can give \(DASHINFER_MEMORY_LIMIT_MB\)", last), last
