"""The process that loads the fuzzed model files of tests/test_fuzz_model_files.py, one per line.

Reads JSON lines {"kind": "gguf"|"hf"|"serialized", "path": ...} from stdin and answers each with
{"outcome": "ok"|"refused"|"other", "error": ..., "grew_mib": ...} on stdout, where "refused" is the
loaders' documented ModelSerializerException and grew_mib is how far the resident memory's peak
rose above where it stood before the load. {"limit_mib": N} caps the address space at N MiB above
its current size, so an allocation the file cannot justify fails (MemoryError) instead of taking
the machine. The parent times every answer: a load that does not answer is a hang.
"""
import json
import os
import re
import resource
import sys


def load(kind, path):
    """Everything a user's load reads: config, every tensor's data, the tokenizer."""
    from dashinfer_client.model.serialized import weight_shapes
    if kind == "serialized":
        from dashinfer_client.model.serialized import DashInferModel
        model = DashInferModel(path, "tiny")
        for name in model.tensor_names():
            model.tensor(name).sum()
        model.get_tokenizer()("hello")
        return
    if kind == "gguf":
        from dashinfer_client.model.gguf_loader import GGUFModel
        model = GGUFModel(path, "fuzz", user_set_data_type="float32")
    else:
        from dashinfer_client.model.hf import HuggingFaceModel
        model = HuggingFaceModel(path, "fuzz", user_set_data_type="float32")
    model.load_model()
    for name in weight_shapes(model.config, model.architecture):
        model.weights.fetch(name)[0].sum()
    if kind == "hf":
        model.get_tokenizer()("hello")


def _status(field):
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+)", f.read(), re.M).group(1))  # KiB


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as f:  # 5: VmHWM restarts from the current RSS
        f.write("5")


def main():
    from dashinfer_client.errors import ModelSerializerException
    for line in sys.stdin:
        case = json.loads(line)
        if "limit_mib" in case:
            limit = _status("VmSize") * 1024 + case["limit_mib"] * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            print(json.dumps({"outcome": "ok"}), flush=True)
            continue
        _reset_peak()
        before = _status("VmRSS")
        try:
            load(case["kind"], case["path"])
            answer = {"outcome": "ok"}
        except ModelSerializerException as e:
            answer = {"outcome": "refused", "error": str(e).splitlines()[0][:300]}
        except BaseException as e:  # noqa: BLE001 (what the test is looking for)
            answer = {"outcome": "other", "error": f"{type(e).__name__}: {str(e)[:300]}"}
        answer["grew_mib"] = (_status("VmHWM") - before) / 1024
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
