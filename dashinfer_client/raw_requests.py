"""DashInfer's raw request API, for both engines: the prompt as a tensor dict (start_request),
results read through the engine (get_wait, get_no_wait, get_request_status, v1's get_output_*),
and LoRA, refused with DashInfer's statuses. A mixin of EngineAPI, over its _start and _guarded."""
from .raw_inputs import InputError, input_ids_of
from .refusals import PARAM_ERROR, Refused, checked_model_name
from .result_queue import ResultQueue
from .types import AsStatus


class RawRequestAPI:
    def start_request(self, model_name: str, inputs, generate_config=None):
        """DashInfer's general form: inputs {"input_ids": a DLPack capsule, an object with
        __dlpack__ (torch tensor), a numpy array or a list (of one list) of ids}, generate_config a
        dict of options (a built ASGenerationConfig; None: the defaults) or a builder.
        -> (AsStatus, handle, ResultQueue), as start_request_ids."""
        return self._start(model_name, None, lambda: _raw_input_ids(inputs),
                           {} if generate_config is None else generate_config)

    def get_no_wait(self, model_name: str, result_queue) -> list:
        """The ids generated since the last read, [] when there are none (ResultQueue.GetNoWait,
        ids only, as DashInfer's binding returns them). model_name is not read, as in DashInfer."""
        return _ids(_queue("get_no_wait", result_queue).GetNoWait())

    def get_wait(self, model_name: str, result_queue) -> list:
        """As get_no_wait, but blocks until there are new ids or the request has ended ([] then)."""
        return _ids(_queue("get_wait", result_queue).Get())

    def get_output_no_wait(self, model_name: str, result_queue):
        """v1's name: the GeneratedElements since the last read (ids, logprobs, prefix lengths), or
        None. DashInfer 1.x declared it but its binding never defined it (AttributeError there);
        here it is ResultQueue.GetNoWait, the whole output where get_no_wait gives the ids."""
        return _queue("get_output_no_wait", result_queue).GetNoWait()

    def get_output_wait(self, model_name: str, result_queue):
        """v1's name: ResultQueue.Get (blocks; None once the request has ended and all was read)."""
        return _queue("get_output_wait", result_queue).Get()

    def get_request_status(self, model_name: str, result_queue):
        """The request's GenerateRequestStatus (ResultQueue.GenerateStatus)."""
        return _queue("get_request_status", result_queue).GenerateStatus()

    # LoRA: refused (DashInfer's statuses), the same on both engines

    def load_lora(self, model_name: str, lora_name: str) -> AsStatus:
        """Refused: this runtime loads no LoRA adapters. An installed model and a non-empty name
        get ALLSPARK_LORA_NOT_FOUND (no adapter can be found here); else DashInfer's
        PARAM_ERROR."""
        return self._guarded("load_lora", lambda: self._no_lora(model_name, lora_name, "load"))[0]

    def unload_lora(self, model_name: str, lora_name: str) -> AsStatus:
        """Refused as in DashInfer for an adapter never loaded: ALLSPARK_LORA_NOT_FOUND."""
        return self._guarded("unload_lora", lambda: self._no_lora(model_name, lora_name, "unload"))[0]

    def _no_lora(self, model_name, lora_name, verb):
        self._check_installed(checked_model_name(model_name))
        if not isinstance(lora_name, str) or not lora_name:
            raise Refused(PARAM_ERROR, f"lora_name must be a non-empty str, got {lora_name!r}")
        raise Refused(AsStatus.ALLSPARK_LORA_NOT_FOUND,
                      f"cannot {verb} LoRA {lora_name!r}: this runtime loads no LoRA adapters")


def _raw_input_ids(inputs):
    try:
        return input_ids_of(inputs)
    except InputError as e:
        raise Refused(PARAM_ERROR, str(e)) from e


def _queue(call, result_queue) -> ResultQueue:
    """The queue a get_* call reads; a TypeError for anything else (these calls return data, not
    a status: there is no status to refuse with)."""
    if not isinstance(result_queue, ResultQueue):
        raise TypeError(f"{call} takes the ResultQueue start_request returned, got {type(result_queue).__name__}")
    return result_queue


def _ids(elements) -> list:
    return list(elements.ids_from_generate) if elements is not None else []
