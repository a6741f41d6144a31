"""The files a conversion writes under temporary names ({final}.tmp-{pid}, renamed when complete),
and what is left of a conversion that never finished: one killed (SIGKILL, a power cut) leaves its
temporaries, which the next conversion into that directory removes once their process is gone."""
import contextlib
import os
import re
import shutil

from ..errors import ModelSerializerException

_TEMPORARY = re.compile(r"\.(asgraph|asparam|dimodel|ditensors|tokenizer)\.tmp-(\d+)$")


def temporary(path):
    return f"{path}.tmp-{os.getpid()}"


def remove(path):
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


def remove_stale_temporaries(model_dir):
    """Remove the temporaries in model_dir whose converting process is no longer running (a live
    one, a conversion beside this one, is left alone)."""
    for name in os.listdir(model_dir):
        match = _TEMPORARY.search(name)
        if match and not _running(int(match.group(2))):
            remove(os.path.join(model_dir, name))


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def writing(path):
    """An OSError while writing path (a full disk, a quota, an I/O error) becomes the documented
    ModelSerializerException naming it."""
    try:
        yield
    except OSError as e:
        raise ModelSerializerException(f"cannot write {path}: {e.strerror or e}") from None
