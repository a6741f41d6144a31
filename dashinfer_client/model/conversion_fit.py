"""Whether a conversion fits before it starts: the memory it holds at once (one tensor at a time,
bounded by the largest) against what the machine can give, and the files it writes (their exact
sizes, in whole blocks of the disk) against the free disk. serialized.write_serialized refuses
with both figures before it writes anything, or creates the output directory."""
import math
import os
import shutil

from .. import memory
from ..errors import ModelSerializerException

# Bytes a conversion holds at once for a tensor of n elements (_write_params): its source (fp32
# at most, mapped or dequantized) and an fp32 working copy, plus what it becomes: codes and group
# scales (quantized: 10 a weight in all), or the converted float (8); and the quantizer's error
# sums, 3 float64 a row (quant.quantize).
QUANTIZED_BYTES, FLOAT_BYTES, ERROR_ROW_BYTES = 10, 8, 24


def conversion_memory_bound(shapes, quantized):
    """(bytes, tensor name): the most memory converting one tensor of {name: shape} takes, and
    which tensor that is; the conversion holds one tensor at a time, so this bounds its growth."""
    def need(name):
        n = math.prod(shapes[name])
        return QUANTIZED_BYTES * n + ERROR_ROW_BYTES * shapes[name][0] if name in quantized else FLOAT_BYTES * n
    largest = max(shapes, key=need)
    return need(largest), largest


def refuse_what_will_not_fit(model_dir, model_name, shapes, quantized, file_sizes):
    """A conversion that would run out of memory, or of disk for files of file_sizes bytes, is
    refused before it writes anything (model_dir need not exist yet)."""
    need, largest = conversion_memory_bound(shapes, set(quantized))
    have, where = memory.available()
    if need > have:
        raise ModelSerializerException(
            f"converting {model_name} takes up to {memory.gib(need)} of memory at once (tensor {largest}, "
            f"{list(shapes[largest])}), more than the {memory.gib(have)} this machine can give ({where})")
    refuse_what_will_not_fit_on_disk(model_dir, model_name, file_sizes)


def refuse_what_will_not_fit_on_disk(model_dir, model_name, file_sizes):
    disk = _existing_folder(model_dir)
    need = disk_bytes(file_sizes, os.statvfs(disk).f_frsize)
    free = shutil.disk_usage(disk).free
    if need > free:
        raise ModelSerializerException(
            f"converting {model_name} writes {memory.gib(need)} ({need} bytes: the .asparam with its header "
            f"and the .asgraph), more than the {memory.gib(free)} ({free} bytes) free on the disk of {model_dir}")


def disk_bytes(file_sizes, block):
    """What files of these sizes take on a disk of this block size: each a whole number of blocks."""
    return sum(-(-size // block) * block for size in file_sizes)


def _existing_folder(path):
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    return path
