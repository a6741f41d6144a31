"""Whether a conversion fits before it starts: the memory it holds at once (one tensor at a time,
bounded by the largest) against what the machine can give, and the bytes it writes against the
free disk. serialized.write_serialized refuses with both figures before writing anything."""
import math
import shutil

from .. import memory
from ..errors import ModelSerializerException
from .safetensors_io import itemsize

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


def refuse_what_will_not_fit(model_dir, model_name, shapes, quantized, manifest):
    """A conversion that would run out of memory or disk is refused before it writes anything."""
    need, largest = conversion_memory_bound(shapes, set(quantized))
    have, where = memory.available()
    if need > have:
        raise ModelSerializerException(
            f"converting {model_name} takes up to {memory.gib(need)} of memory at once (tensor {largest}, "
            f"{list(shapes[largest])}), more than the {memory.gib(have)} this machine can give ({where})")
    size = sum(math.prod(shape) * itemsize(code) for code, shape in manifest.values())
    free = shutil.disk_usage(model_dir).free
    if size > free:
        raise ModelSerializerException(
            f"converting {model_name} writes {memory.gib(size)} of weights, more than the {memory.gib(free)} "
            f"free on the disk of {model_dir}")
