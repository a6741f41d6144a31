"""The OpenAI- and Anthropic-compatible HTTP API over one served model (FastAPI; run by uvicorn,
see serve.py).

    POST /v1/chat/completions, POST /v1/completions   OpenAI's (stream: Server-Sent Events)
    POST /v1/messages, POST /v1/messages/count_tokens Anthropic's Messages API (anthropic.py)
    POST /v1/responses                                 OpenAI's Responses API, stateless (responses_api.py)
    GET  /v1/models, /health (200 serving, 503 not), /metrics (Prometheus text)
    POST /tokenize, /detokenize                        (vLLM's shapes: tokenize.py)

With an API key every /v1 route and /tokenize, /detokenize want `Authorization: Bearer <key>` or
`x-api-key: <key>`. Errors are in the shape of the route's API (OpenAI's {"error": {message, type,
param, code}}, Anthropic's {"type": "error", "error": {type, message}}) with the HTTP status of
errors.STATUS_TO_HTTP. Every API runs on the same front end: parsed Jobs, one per choice, each
through generate() and the admission gate (admission.py: 429 beyond the queue's bound, deadlines)
in a Choices, and an answer object that shapes the Deltas (responses.Answer,
anthropic.MessageAnswer, responses_api.ResponseAnswer). /health and /metrics run on threads of their
own, so a queue of engine calls never delays them.
"""
import asyncio
import contextlib
import hmac
import json
import re
from concurrent.futures import ThreadPoolExecutor

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from . import anthropic, responses_api
from .admission import Admission
from .choices import Choices
from .errors import ApiError, bad_request
from .metrics import Metrics
from .protocol import chat_choices, check_model, completion_choices
from .responses import Answer
from .tokenize import tokenize_routes

# what the admission gate bounds
GENERATING_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")


def create_app(served, api_key=None, admission=None) -> FastAPI:
    """served: a ServedModel (loading or serving); api_key: required on /v1 routes when set;
    admission: the Admission gate (default: the model's batch, admission.MAX_WAITING queued)."""
    admission = admission or Admission(served.runtime.max_batch)
    metrics = Metrics(served, admission)
    probes = ThreadPoolExecutor(2, thread_name_prefix="dashinfer-http-probe")  # /health, /metrics

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.ensure_future(metrics.log_throughput())
        yield
        task.cancel()
        probes.shutdown(wait=False)
    app = FastAPI(title="dashinfer", docs_url=None, redoc_url=None, lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return error_answer(request, e)

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        return error_answer(request, ApiError(e.status_code, str(e.detail), "invalid_request_error"))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, e):
        return error_answer(request, bad_request(str(e)))

    def key_ok(headers) -> bool:
        if not api_key:
            return True
        scheme, _, bearer = headers.get("authorization", "").partition(" ")  # the scheme is case-insensitive
        key = headers.get("x-api-key")
        return (scheme.lower() == "bearer" and hmac.compare_digest(bearer.strip().encode(), api_key.encode())) or \
            (key is not None and hmac.compare_digest(key.encode(), api_key.encode()))

    async def check_key(request: Request):
        if not key_ok(request.headers):
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer <key> or x-api-key: <key>)",
                           "authentication_error", code="invalid_api_key")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    @app.get("/health")
    async def health():
        ok, why = await asyncio.get_running_loop().run_in_executor(probes, served.health)
        return JSONResponse({"status": "ok" if ok else served.state, "message": why},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus():
        body = await asyncio.get_running_loop().run_in_executor(probes, metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    def model_card():
        return {"id": served.name, "object": "model", "created": 0, "owned_by": "dashinfer",
                "max_model_len": served.max_length, "sampling_defaults": served.sampling_defaults}

    @v1.get("/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @v1.get("/models/{model_id:path}")
    async def model(model_id: str):
        check_model({"model": model_id}, served)
        return model_card()

    async def parsed(request: Request, parse):
        """The body and its parse, in a worker thread: a long prompt's tokenizing must not hold
        the event loop, which streams every other answer and answers /health."""
        body = await _json(request)
        check_model(body, served)
        return body, await asyncio.to_thread(parse, body, served)

    async def complete(request: Request, parse, answer_of):
        body, jobs = await parsed(request, parse)
        if len(jobs) > admission.limit:  # would be refused with 429 however long the client waited
            raise bad_request(f"{len(jobs)} choices (n times the prompts) exceed the {admission.limit} requests "
                              f"this server holds at once", "n")
        answer = answer_of(jobs[0], served)
        choices = Choices(served, jobs, metrics, answer.id, lambda deltas: admission.admit(body, deltas))
        if answer.job.stream:
            # a refusal is still an HTTP error, not a stream; a client gone before the first
            # pieces (queued behind a full batch) has its requests stopped and released
            firsts = await _unless_disconnected(request, choices.first_pieces())
            if firsts is None:
                await choices.close()
                return Response(status_code=499)
            return StreamingResponse(answer.events(choices, firsts), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        collected = await _unless_disconnected(request, choices.whole())
        return answer.whole(collected, choices.usage()) if collected is not None else Response(status_code=499)

    @v1.post("/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat_choices, Answer)

    @v1.post("/completions")
    async def completions(request: Request):
        return await complete(request, completion_choices, Answer)

    @v1.post("/messages")
    async def messages(request: Request):
        return await complete(request, anthropic.parse_messages, anthropic.MessageAnswer)

    @v1.post("/responses")
    async def responses(request: Request):
        return await complete(request, responses_api.parse_responses, responses_api.ResponseAnswer)

    @v1.post("/messages/count_tokens")
    async def count_tokens(request: Request):
        _, job = await parsed(request, anthropic.parse_count_tokens)
        return {"input_tokens": len(job.prompt_ids)}

    app.include_router(v1)
    app.include_router(tokenize_routes(served, _json, check_key))
    app.add_middleware(lambda inner: admission.refuse_early(inner, GENERATING_ROUTES, _error_body, key_ok))
    return app


async def _json(request) -> dict:
    return await asyncio.to_thread(_parse_json, await request.body())


# A \u escape of a UTF-16 surrogate: the cheap test before the whole body is checked for lone ones
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or a 400: not JSON, nested past Python's recursion limit, or
    holding a lone UTF-16 surrogate (valid JSON, not text: no tokenizer can take it). NaN and
    Infinity, which Python's reader takes, are no JSON: echoed in an answer, they could not be written."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise bad_request("the body is not valid JSON here: it is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, _no_constant's
        raise bad_request(f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw):
        try:
            json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError as e:
            raise bad_request(f"the body holds a lone UTF-16 surrogate ({e.object[e.start]!r}), which is not "
                              f"Unicode text") from None
    return body


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


async def _unless_disconnected(request, work):
    """work's result, or None when the client disconnects first (work is then cancelled, which
    stops and releases its request)."""
    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        return None
    return task.result()


def error_answer(request, e: ApiError) -> JSONResponse:
    return JSONResponse(_error_body(request.url.path, e), status_code=e.http_status, headers=e.headers)


def _error_body(path, e: ApiError) -> dict:
    """The error in the shape of the route's API."""
    return anthropic.error_body(e) if anthropic.is_route(path) else e.body()
