"""The `inputs` of DashInfer's raw start_request: {"input_ids": ...} -> the prompt's token ids.

DashInfer's callers pass a DLPack capsule (torch.utils.dlpack.to_dlpack(ids)); here an object
with __dlpack__ (a torch tensor, a numpy array), a numpy array or a list (of lists) of ints works
too. numpy reads DLPack, so no torch is needed at run time. A bare capsule is read as DashInfer reads
it: its ids are copied and the capsule is left as it was (not marked used), so the same capsule can
start several requests, as DashInfer's own examples do.
"""
import ctypes

import numpy as np

_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 10: "ROCm"}
_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]

# Where the DLTensor sits in a capsule's struct: first in a DLManagedTensor; after version,
# manager_ctx, deleter and flags in a DLManagedTensorVersioned.
_TENSOR_OFFSET = {b"dltensor": 0, b"dltensor_versioned": 32}
_INT_CODES = {0: "i", 1: "u"}  # DLPack's kDLInt, kDLUInt


class InputError(ValueError):
    """The inputs cannot be read; the message says why."""


def input_ids_of(inputs):
    """inputs: DashInfer's dict {"input_ids": ids} -> the ids as a numpy array or a list (the
    engine checks their shape and values); InputError for anything else."""
    if not isinstance(inputs, dict):
        raise InputError(f"inputs must be a dict {{'input_ids': ...}}, got {type(inputs).__name__}")
    unknown = sorted(map(repr, set(inputs) - {"input_ids"}))
    if unknown:
        raise InputError(f"unknown input(s) {', '.join(unknown)}: a text model reads input_ids only")
    if "input_ids" not in inputs:
        raise InputError("inputs has no 'input_ids'")
    ids = inputs["input_ids"]
    if type(ids).__name__ == "PyCapsule":
        return _copy_capsule(ids)
    if hasattr(ids, "__dlpack__") and not isinstance(ids, np.ndarray):
        try:
            return np.from_dlpack(ids)
        except InputError:
            raise
        except (BufferError, TypeError, ValueError, RuntimeError) as e:
            raise InputError(f"input_ids: cannot read the DLPack tensor: {e}") from e
    return ids


def _copy_capsule(capsule) -> np.ndarray:
    """A copy of the integer tensor a DLPack capsule holds (on the CPU); the capsule is unchanged."""
    name = next((n for n in _TENSOR_OFFSET if _api.PyCapsule_IsValid(capsule, n)), None)
    if name is None:
        raise InputError("input_ids: a capsule that is not an unused DLPack tensor")
    t = _DLTensor.from_address(_api.PyCapsule_GetPointer(capsule, name) + _TENSOR_OFFSET[name])
    if t.device_type != 1:
        raise InputError(f"input_ids: the tensor is on {_DEVICE_NAMES.get(t.device_type, t.device_type)}:"
                         f"{t.device_id}; this runtime reads CPU tensors (call .cpu() first)")
    if t.code not in _INT_CODES or t.bits not in (8, 16, 32, 64) or t.lanes != 1 or not 1 <= t.ndim <= 2:
        raise InputError(f"input_ids: a DLPack tensor of {t.ndim} dimension(s) and type code {t.code}, "
                         f"{t.bits} bits: token ids are a 1-D or 2-D integer tensor")
    dtype = np.dtype(f"{_INT_CODES[t.code]}{t.bits // 8}")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    steps = (tuple(t.strides[i] for i in range(t.ndim)) if t.strides
             else tuple(int(np.prod(shape[i + 1:])) for i in range(t.ndim)))
    if 0 in shape:
        return np.zeros(shape, dtype)
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(shape, steps))  # elements the view reaches
    base = np.ctypeslib.as_array((ctypes.c_byte * (span * dtype.itemsize)).from_address(t.data + t.byte_offset))
    view = np.lib.stride_tricks.as_strided(base.view(dtype), shape, tuple(s * dtype.itemsize for s in steps))
    return view.copy()
