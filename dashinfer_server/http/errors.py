"""Errors of the HTTP API in OpenAI's shape, and the one table from the engine's AsStatus to an
HTTP status: the engine decides what is wrong with a request, this module only says it in HTTP."""
from dashinfer_client.refusals import CALLER_MISTAKES
from dashinfer_client.types import AsStatus

# AsStatus of a refused engine call -> (HTTP status, OpenAI error type).
_BAD = (400, "invalid_request_error")
_UNAVAILABLE = (503, "service_unavailable_error")
_INTERNAL = (500, "server_error")
STATUS_TO_HTTP = {
    **{status: _BAD for status in CALLER_MISTAKES},  # prompt over the context, max_tokens too large, ...
    AsStatus.ALLSPARK_REQUEST_DENIED: _UNAVAILABLE,   # the model is stopping (drain)
    AsStatus.ALLSPARK_INVALID_CALL_ERROR: _UNAVAILABLE,  # the model is not running
    AsStatus.ALLSPARK_RUNTIME_ERROR: _UNAVAILABLE,    # the rank group is lost or restarting
    AsStatus.ALLSPARK_MEMORY_ERROR: _UNAVAILABLE,
}


class ApiError(Exception):
    """An error answered to the client: HTTP status, OpenAI error type, message, param, code,
    and headers of the answer if any."""

    def __init__(self, http_status: int, message: str, err_type: str = "invalid_request_error",
                 param=None, code=None, headers=None):
        super().__init__(message)
        self.http_status, self.message, self.type, self.param, self.code = \
            http_status, message, err_type, param, code
        self.headers = headers  # of the answer (a 429's Retry-After)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, param=None) -> ApiError:
    return ApiError(400, message, param=param)


def refused(e) -> ApiError:
    """The engine refused a request (e: a Refused, its status and reason)."""
    http_status, err_type = STATUS_TO_HTTP.get(e.status, _INTERNAL)
    return ApiError(http_status, str(e) or e.status.name, err_type, code=e.status.name)


def unavailable(message: str) -> ApiError:
    return ApiError(*_UNAVAILABLE[:1], message, _UNAVAILABLE[1])
