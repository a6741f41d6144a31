"""The `inputs` of DashInfer's raw start_request: {"input_ids": ...} -> the prompt's token ids.

DashInfer's callers pass a DLPack capsule (torch.utils.dlpack.to_dlpack(ids)); here an object
with __dlpack__ (a torch tensor, a numpy array), a numpy array or a list (of lists) of ints works
too. numpy reads DLPack, so no torch is needed at run time. A capsule is one-shot: numpy takes it
over (DLPack renames it "used_dltensor") and frees the producer's tensor with the array.
"""
import ctypes

import numpy as np

_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 10: "ROCm"}
_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

# Where DLDevice {int32 device_type, int32 device_id} sits in a capsule's struct: after the data
# pointer of a DLManagedTensor's DLTensor; after version, manager_ctx, deleter and flags, then the
# data pointer, in a DLManagedTensorVersioned.
_DEVICE_OFFSET = {b"dltensor": 8, b"dltensor_versioned": 40}


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
        ids = _Capsule(ids)
    if hasattr(ids, "__dlpack__") and not isinstance(ids, np.ndarray):
        try:
            return np.from_dlpack(ids)
        except InputError:
            raise
        except (BufferError, TypeError, ValueError, RuntimeError) as e:
            raise InputError(f"input_ids: cannot read the DLPack tensor: {e}") from e
    return ids


class _Capsule:
    """A bare DLPack capsule as the object numpy.from_dlpack asks for."""

    def __init__(self, capsule):
        self.capsule = capsule
        self.name = next((n for n in _DEVICE_OFFSET if _api.PyCapsule_IsValid(capsule, n)), None)
        if self.name is None:
            raise InputError("input_ids: a capsule that is not an unused DLPack tensor "
                             "(a DLPack capsule can be read once)")

    def __dlpack__(self, **_):
        return self.capsule

    def __dlpack_device__(self):
        address = _api.PyCapsule_GetPointer(self.capsule, self.name) + _DEVICE_OFFSET[self.name]
        kind, index = (ctypes.c_int32 * 2).from_address(address)
        if kind != 1:
            raise InputError(f"input_ids: the tensor is on {_DEVICE_NAMES.get(kind, kind)}:{index}; "
                             f"this runtime reads CPU tensors (call .cpu() first)")
        return kind, index
