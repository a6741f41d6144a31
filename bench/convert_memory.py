"""Peak resident memory of converting a checkpoint and of loading the result, each in a fresh
process: the growth of VmHWM (its high-water mark reset after the imports) over VmRSS at that
point, beside the checkpoint's and the serialized model's sizes and the bound the conversion is
held to (dashinfer_client/model/conversion_fit.py conversion_memory_bound: one tensor at a time).

    PYTHONPATH=. python -m bench.make_model qwen3-30b-a3b /tmp/q3moe-3l --layers 3
    PYTHONPATH=. python bench/convert_memory.py /tmp/q3moe-3l /tmp/q3moe-3l-uint4 --quant uint4
"""
import argparse
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs in the child: the step to measure after its imports, then the VmRSS before and VmHWM after.
_CHILD = r"""
import json, sys
args = json.loads(sys.argv[1])

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS

import numpy
from dashinfer_client.model import DashInferModel, HuggingFaceModel
if args["step"] == "convert":
    loader = HuggingFaceModel(args["src"], args["name"], user_set_data_type="bfloat16", progress=False)
    loader.load_model().read_model_config()
    quant = args["quant"]
    reset_peak()
    before = status("VmRSS")
    loader.serialize_to_path(None, args["out"], enable_quant=quant is not None, weight_only_quant=True,
                             customized_quant_config=quant and {"weight_format": quant["format"],
                                                                "group_size": quant["group"]})
else:
    from dashinfer_server import kernels
    kernels.load()
    from dashinfer_server.model import DecoderModel
    model = DashInferModel(args["out"], args["name"])
    reset_peak()
    before = status("VmRSS")
    decoder = DecoderModel(model, "bf16", num_blocks=4, block_size=16, max_tokens=64, max_seqs=1)
print(json.dumps({"before": before, "peak": status("VmHWM"), "after": status("VmRSS")}))
"""


def measure(step, src, out, name, quant=None, env=None) -> dict:
    """{"before", "peak", "after"} resident bytes of one step ("convert" src -> out, or "load" out)
    in a child: before it, its high-water mark, after it."""
    args = {"step": step, "src": src, "out": out, "name": name, "quant": quant}
    run = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True,
                         env=dict(os.environ if env is None else env, PYTHONPATH=ROOT), check=False)
    if run.returncode:
        raise RuntimeError(f"{step} failed: {run.stderr.strip()[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def files_bytes(pattern) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(pattern))


def main():
    from dashinfer_client.model.arch import normalize_hf_config
    from dashinfer_client.model.quant import DEFAULT_GROUPS, InstantQuantSettings
    from dashinfer_client.model.conversion_fit import conversion_memory_bound
    from dashinfer_client.model.serialized import weight_shapes
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", help="a Hugging Face checkpoint directory")
    p.add_argument("out", help="where to write the serialized model")
    p.add_argument("--quant", choices=("int8", "uint4"), default=None)
    args = p.parse_args()
    quant = args.quant and {"format": args.quant, "group": DEFAULT_GROUPS[args.quant]}
    with open(os.path.join(args.src, "config.json")) as f:
        arch, config = normalize_hf_config(json.load(f))
    shapes = weight_shapes(config, arch)
    quantized = InstantQuantSettings(args.quant).quantized_names(shapes) if args.quant else []
    bound, largest = conversion_memory_bound(shapes, set(quantized))
    convert = measure("convert", args.src, args.out, "model", quant)
    load = measure("load", args.src, args.out, "model")
    gib = 2**30
    print(f"checkpoint {files_bytes(os.path.join(args.src, '*.safetensors')) / gib:.2f} GiB -> "
          f"{args.quant or 'bfloat16'} model {files_bytes(os.path.join(args.out, 'model.asparam')) / gib:.2f} GiB")
    print(f"convert: peak RSS {convert['peak'] / gib:.2f} GiB, growth {(convert['peak'] - convert['before']) / gib:.3f} "
          f"GiB (bound {bound / gib:.3f} GiB, from {largest} {list(shapes[largest])})")
    print(f"load:    peak RSS {load['peak'] / gib:.2f} GiB, growth {(load['peak'] - load['before']) / gib:.3f} GiB, "
          f"resident once loaded {load['after'] / gib:.2f} GiB")


if __name__ == "__main__":
    main()
