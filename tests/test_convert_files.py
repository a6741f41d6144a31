"""What a conversion leaves on disk when it cannot finish: the disk check counts the exact files
(the .asparam's header and the .asgraph included), a full disk while writing is a
ModelSerializerException naming the file with the temporaries removed, and temporaries of a
conversion that was killed are removed by the next one."""
import json
import os
import subprocess
import sys

import pytest

from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import HuggingFaceModel
from dashinfer_client.model.conversion_fit import disk_bytes
from dashinfer_client.model.safetensors_io import SafetensorsFile, planned_size
from tests.helpers import build_tiny_model

BLOCK = 4096  # tmpfs's block: a page

# Converts argv[1] into argv[2] (on the tmpfs) and prints what happened as JSON; with argv[3]
# "no-check", the free-space check sees a huge disk, so the writes themselves run out of space.
CONVERT = """
import json, os, shutil, sys
from types import SimpleNamespace
from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import HuggingFaceModel
if sys.argv[3] == "no-check":
    shutil.disk_usage = lambda path: SimpleNamespace(total=1 << 40, used=0, free=1 << 40)
try:
    HuggingFaceModel(sys.argv[1], "m", user_set_data_type="float32", progress=False) \\
        .load_model().serialize_to_path(None, sys.argv[2])
    result = "converted"
except ModelSerializerException as e:
    result = "refused: " + str(e)
out = sys.argv[2]
print(json.dumps([result, sorted(os.listdir(out)) if os.path.isdir(out) else None]))
"""


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(source dir, reference conversion dir) of a tiny checkpoint with its tokenizer."""
    base = tmp_path_factory.mktemp("convert-files")
    src = build_tiny_model(str(base / "src"))
    HuggingFaceModel(src, "m", user_set_data_type="float32", progress=False).load_model() \
        .serialize_to_path(None, str(base / "ref"))
    return src, str(base / "ref")


def sizes_on_disk(ref):
    """(bytes of .asparam + .asgraph, bytes of the tokenizer files), in whole blocks."""
    files = disk_bytes([os.path.getsize(os.path.join(ref, f"m{s}")) for s in (".asparam", ".asgraph")], BLOCK)
    tok = os.path.join(ref, "m.tokenizer")
    return files, disk_bytes([os.path.getsize(os.path.join(tok, f)) for f in os.listdir(tok)], BLOCK)


def can_mount_tmpfs(where):
    return subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {where}"],
                          capture_output=True).returncode == 0


def convert_on_tmpfs(src, mount, size, check="check"):
    """Convert src onto a tmpfs of `size` bytes at mount, in a private mount namespace (nothing
    outside sees it) -> (what happened, what the output directory held)."""
    done = subprocess.run(["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs "$1" && shift && '
                           f'exec "$@"', "-", mount, sys.executable, "-c", CONVERT, src, f"{mount}/out", check],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_disk_check_counts_the_exact_files(converted):
    _, ref = converted
    written = SafetensorsFile(os.path.join(ref, "m.asparam"))
    layout = [(name, *written.info(name)) for name in written.keys()]
    assert planned_size(layout, written.metadata) == os.path.getsize(os.path.join(ref, "m.asparam"))
    assert disk_bytes([1, BLOCK, BLOCK + 1], BLOCK) == 4 * BLOCK


def test_a_disk_too_small_is_refused_before_anything_is_written(converted, tmp_path):
    src, ref = converted
    mount = str(tmp_path / "small")
    os.makedirs(mount)
    files, tok = sizes_on_disk(ref)
    if not can_mount_tmpfs(mount):  # no private mounts here: the same figures without a disk
        with pytest.raises(ModelSerializerException, match=rf"\({files} bytes: the .asparam with its header"):
            from types import SimpleNamespace
            from unittest import mock
            with mock.patch("shutil.disk_usage", lambda p: SimpleNamespace(total=files, used=0, free=files - 1)):
                HuggingFaceModel(src, "m", progress=False).load_model().serialize_to_path(None, str(tmp_path / "o"))
        assert not os.path.exists(tmp_path / "o")
        return
    # room for the weights' bytes alone, not for the header, the .asgraph and the tokenizer
    result, left = convert_on_tmpfs(src, mount, files - BLOCK)
    assert result.startswith(f"refused: converting m writes") and f"({files} bytes: the .asparam" in result
    assert left is None  # not even the output directory
    # room for everything but one block: refused once the tokenizer is written, which is removed
    result, left = convert_on_tmpfs(src, mount, files + tok - BLOCK)
    assert result.startswith("refused: converting m writes") and left == []
    # exactly the room it takes: converted
    assert convert_on_tmpfs(src, mount, files + tok) == ["converted", ["m.asgraph", "m.asparam", "m.tokenizer"]]
    # the disk fills while writing (the check sees a huge disk): the file is named, nothing is left
    result, left = convert_on_tmpfs(src, mount, files // 2, check="no-check")
    assert result == f"refused: cannot write {mount}/out/m.asparam: No space left on device" and left == []


def test_sigterm_while_dashinfer_convert_writes_leaves_nothing(tmp_path):
    """As systemd stops a service: the temporaries are removed, then the process ends by the signal."""
    import signal
    import time
    from tests.http_server import cli_env
    src = build_tiny_model(str(tmp_path / "big"), hidden_size=1024, intermediate_size=4096, vocab_size=32000,
                           num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "dashinfer", "convert", src, str(out), "--quant", "uint4"],
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not list(out.glob("*.asparam.tmp-*")) and proc.poll() is None:  # writing the weights now
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM and err.strip().splitlines()[-1] == "dashinfer convert: terminated"
    assert os.listdir(out) == []


def test_temporaries_of_a_killed_conversion_are_removed_by_the_next(converted, tmp_path):
    src, _ = converted
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a process that is gone, as one killed by SIGKILL
    stale = [f"m.asparam.tmp-{dead.pid}", f"other.asgraph.tmp-{dead.pid}", f"m.tokenizer.tmp-{dead.pid}"]
    live = f"m.asparam.tmp-{os.getppid()}"  # a conversion still running beside this one
    for name in stale[:2] + [live, "m.asparam.tmp-notapid"]:
        (tmp_path / name).write_bytes(b"partial")
    os.makedirs(tmp_path / stale[2])
    HuggingFaceModel(src, "m", user_set_data_type="float32", progress=False).load_model() \
        .serialize_to_path(None, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted(["m.asgraph", "m.asparam", "m.tokenizer", live,
                                                   "m.asparam.tmp-notapid"])
