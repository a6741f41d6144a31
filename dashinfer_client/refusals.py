"""How a call of DashInfer's API is refused: the Refused exception an engine's primitive raises,
and the checks every engine makes the same way (a model name, an unknown model or handle)."""
from .checks import brief
from .types import AsStatus

SUCCESS = AsStatus.ALLSPARK_SUCCESS
PARAM_ERROR = AsStatus.ALLSPARK_PARAM_ERROR
# Refusals that are the caller's mistake (HTTP answers them 400): logged as warnings, not errors.
CALLER_MISTAKES = frozenset({PARAM_ERROR, AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR, AsStatus.ALLSPARK_EMPTY_REQUEST,
                             AsStatus.ALLSPARK_CACHE_MEMORY_OUT,  # a prompt that can never fit the KV cache
                             AsStatus.ALLSPARK_LORA_NOT_LOADED})


class Refused(Exception):
    """A refused call: its status and why. named: the message already names the call (a server's
    refusal, relayed as it is)."""

    def __init__(self, status: AsStatus, message: str, named: bool = False):
        super().__init__(message)
        self.status = AsStatus(status)
        self.named = named


def unknown_model(name) -> Refused:
    return Refused(PARAM_ERROR, f"unknown model {brief(name)}")


def unknown_handle(name, handle) -> Refused:
    return Refused(AsStatus.ALLSPARK_ILLEGAL_REQUEST_ID,
                   f"unknown request handle {brief(handle)} for model {brief(name)}")


def text_or_empty(name) -> str:
    return name if isinstance(name, str) else ""


def checked_model_name(name) -> str:
    if not isinstance(name, str):
        raise Refused(PARAM_ERROR, f"a model name is a str, got {type(name).__name__} {brief(name)}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Refused(PARAM_ERROR, f"model name {brief(name)} is not valid text ({e.reason})") from e
    return name
