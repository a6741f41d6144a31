"""The conversion's quantizer (native/linear_quantize.c in dashinfer_client.model._quantize, its
own module without OpenMP) against the numpy reference (tests/quant_reference.numpy_quantize):
bit for bit on weights of every kind and on every split of rows over threads, and on every
quantized tensor of a converted family model. And what the separate module is for: a process
that converts has loaded neither the kernels nor libgomp and keeps no thread of it, so a rank
that places itself afterwards runs the thread count of its placement."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dashinfer_client.dtypes import from_bf16, to_bf16
from dashinfer_client.model import DashInferModel, HuggingFaceModel, quant
from dashinfer_client.model._quantize import quantize_into
from tests.helpers import build_tiny_model, serialize
from tests.quant_reference import numpy_quantize, stored_parts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def weights(n, k, seed=0):
    """Rows of very different magnitudes (1e-37, a float32 scale in the denormal range, to 1e30),
    shifted means, a constant group, a row of zeros, bf16-rounded rows."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)) * rng.uniform(0.01, 3.0, (n, 1)) + rng.uniform(-1, 1, (n, 1))
    w[0] *= 1e30
    w[1] *= 1e-37
    w[2, :32] = 0.25
    w[3] = 0
    w = w.astype(np.float32)
    w[4:6] = from_bf16(to_bf16(w[4:6]))
    return w


@pytest.mark.parametrize("fmt", ["int8", "uint4"])
@pytest.mark.parametrize("n,k,group", [(37, 192, 64), (37, 192, -1), (9, 96, 32), (11, 160, 64), (7, 96, 64),
                                       (13, 320, 32), (13, 352, 64)])
def test_c_quantizer_is_the_numpy_reference_bit_for_bit(fmt, n, k, group, monkeypatch):
    """Groups that divide K, one group a row (-1), ragged last groups (160, 96 and 352 by 64), rows of
    10 groups (uint4 takes 4 groups at once where the CPU has AVX, the rest one by one), rows split
    over 1 to more threads than rows; float32 and bf16 bits."""
    w = weights(n, k)
    bf16 = to_bf16(w)
    for source, values in ((w, w), (bf16, from_bf16(bf16))):  # bf16 bits are read as they are
        want = numpy_quantize(values, fmt, group)
        for threads in (1, 2, 3, n, 64):
            monkeypatch.setattr(quant.os, "sched_getaffinity", lambda pid, t=threads: set(range(t)))
            got = quant.quantize(source, fmt, group)
            assert len(got) == len(want) == (4 if fmt == "uint4" else 3)
            for part, ref in zip(got, want):
                assert part.dtype == ref.dtype and part.shape == ref.shape
                assert np.array_equal(part, ref), f"{source.dtype}, {threads} threads"


@pytest.mark.parametrize("fmt,group", [("int8", 64), ("uint4", 32), ("uint4", 64)])
def test_error_statistics_are_those_of_the_dequantized_weight(fmt, group):
    """The report's error: numpy float32 dequantization of the reference's codes, minus w."""
    w = weights(40, 160)[6:]  # finite magnitudes: a 1e30 row would dwarf every other
    stats = quant.QuantErrorStats()
    quant.quantize(w, fmt, group, stats)
    err = quant.dequantize(numpy_quantize(w, fmt, group), fmt, group) - w
    got = stats.summary()
    assert got["max_abs_error"] == np.abs(err).max() and got["quantized_elements"] == w.size
    want = np.sqrt(np.square(err, dtype=np.float64).sum() / np.square(w, dtype=np.float64).sum())
    assert got["relative_rms_error"] == pytest.approx(want, rel=1e-12)


def test_quantize_into_refuses_arrays_of_the_wrong_shape():
    w = weights(8, 64)
    codes, scales, zeros = np.empty((8, 64), np.uint8), np.empty((8, 2), np.float32), np.empty((8, 2), np.float32)
    with pytest.raises(ValueError, match="scales has size 3 in dimension 1, expected 2"):
        quantize_into(w, 32, 8, codes, np.empty((8, 3), np.float32), zeros, None, None, 2)
    with pytest.raises(ValueError, match="error has size 2 in dimension 1, expected 3"):
        quantize_into(w, 32, 8, codes, scales, zeros, None, np.empty((8, 2)), 2)
    with pytest.raises(TypeError, match="error must be float64"):
        quantize_into(w, 32, 8, codes, scales, zeros, None, np.empty((8, 3), np.float32), 2)
    with pytest.raises(ValueError, match="even"):
        quantize_into(w, 31, 4, codes, scales, zeros, np.empty(8, np.float32), None, 2)
    with pytest.raises(ValueError, match="bits must be 8 or 4"):
        quantize_into(w, 32, 2, codes, scales, zeros, None, None, 2)


@pytest.mark.parametrize("fmt,group,dtype", [("uint4", 32, "float32"), ("int8", 64, "float32"),
                                             ("uint4", 32, "bfloat16")])
def test_a_converted_family_model_holds_the_numpy_reference_codes(tiny_checkpoint, tmp_path, fmt, group, dtype):
    """Qwen3-MoE (experts, attention, dense MLP layer), float32 and bf16 checkpoints: every quantized
    tensor as the numpy reference quantizes the tensor the checkpoint holds under that name (its
    reader: the family's own view)."""
    src = tiny_checkpoint("qwen3_moe") if dtype == "float32" else \
        build_tiny_model(str(tmp_path / "hf"), arch="qwen3_moe", dtype=dtype)
    out = tmp_path / "out"
    serialize(src, out, dtype="bfloat16", enable_quant=True,
              customized_quant_config={"quant_method": "instant_quant", "weight_format": fmt, "group_size": group})
    model = DashInferModel(str(out), "tiny")
    names = model.quantization["quantized"]
    assert any(".experts." in n for n in names) and any("self_attn" in n for n in names)
    source = HuggingFaceModel(src, "tiny", user_set_data_type="bfloat16", progress=False).load_model()
    for name in names:
        array, code = source.weights.fetch(name)
        assert code == {"float32": "F32", "bfloat16": "BF16"}[dtype]
        values = from_bf16(array) if code == "BF16" else array
        for got, want in zip(stored_parts(model, name, fmt), numpy_quantize(values, fmt, group)):
            assert np.array_equal(got, want), name


# Converts in a fresh process, then places it as rank 0 of 2 simulated one-core nodes, as a server
# rank does (group.init_group): what the process holds after converting, and the threads it runs then.
_CONVERT_THEN_PLACE = r"""
import json, os, sys
import numpy as np
from dashinfer_client.model.quant import quantize
threads_before = len(os.listdir("/proc/self/task"))
quantize(np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32), "uint4", 32)
with open("/proc/self/maps") as f:
    gomp = "libgomp" in f.read()
state = {"gomp": gomp, "native": "dashinfer_server._native" in sys.modules,
         "threads_left": len(os.listdir("/proc/self/task")) - threads_before}
from dashinfer_server import kernels as K, topology
state["placed_threads"] = topology.place_rank(0, 2).threads
K.load()
state["kernel_threads"] = K.num_threads()
print(json.dumps(state))
"""


def test_converting_leaves_the_process_free_to_be_placed():
    from dashinfer_server.topology import simulated_nodes
    env = dict(os.environ, PYTHONPATH=ROOT, DASHINFER_NUMA_NODES=simulated_nodes(2), DASHINFER_MEMBIND="none")
    env.pop("OMP_NUM_THREADS", None)
    run = subprocess.run([sys.executable, "-c", _CONVERT_THEN_PLACE], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "loaded before the placement" not in run.stderr
    state = json.loads(run.stdout.splitlines()[-1])
    assert (state["gomp"], state["native"], state["threads_left"]) == (False, False, 0)
    # the kernels loaded before the placement would keep every cpu's count (tried: 2 here, placed 1)
    assert state["kernel_threads"] == state["placed_threads"] < len(os.sched_getaffinity(0))


@pytest.mark.parametrize("fmt", ["int8", "uint4"])
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_weight_holding_an_infinity_or_a_nan_is_refused_at_its_first_such_row(fmt, bf16, bad):
    """No code represents one (the C quantizer gave code 0 to a NaN before). The first bad row is
    named whichever thread's share holds it: rows 9 and 30 of 37 on 1, 3 and 8 threads."""
    w = weights(37, 192)
    w[30, 5], w[9, 191] = bad, bad
    w = to_bf16(w) if bf16 else w
    for threads in (1, 3, 8):
        parts = [np.empty(p.shape, p.dtype) for p in numpy_quantize(weights(37, 192), fmt, 64)]
        with pytest.raises(ValueError, match=r"row 9 of the \[37, 192\] weight holds an infinity or a NaN"):
            quantize_into(w, 64, quant.BITS[fmt], *parts[:3], parts[3] if fmt == "uint4" else None, None, threads)
    with pytest.raises(quant.ModelSerializerException, match="InstantQuant: row 9 .* repair the checkpoint"):
        quant.quantize(w, fmt, 64)


def test_converting_a_checkpoint_with_a_nan_names_the_tensor_and_leaves_nothing(tmp_path):
    """The same through a conversion with quantization, and through the kernels' quantizer that
    quantizes the output head at load (dashinfer_server.weights)."""
    from safetensors.numpy import load_file, save_file

    from dashinfer_client.errors import ModelSerializerException
    from dashinfer_server import kernels as K
    src = build_tiny_model(str(tmp_path / "hf"), arch="qwen3")
    path = os.path.join(src, "model.safetensors")
    tensors = load_file(path)
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name][2, 3] = np.nan
    save_file(tensors, path, metadata={"format": "pt"})
    out = tmp_path / "out"
    with pytest.raises(ModelSerializerException, match=f"tensor '{name}': InstantQuant: row 2 of the"):
        serialize(src, out, enable_quant=True, customized_quant_config={"weight_format": "uint4", "group_size": 32})
    assert not os.path.exists(out) or not os.listdir(out)
    with pytest.raises(ValueError, match=r"row 2 of the \[\d+, \d+\] weight holds an infinity or a NaN"):
        K.quantize(tensors[name], 32, 4)
