"""The OpenAI-compatible HTTP API over one served model (FastAPI; run by uvicorn, see serve.py).

    POST /v1/chat/completions, POST /v1/completions   (stream: Server-Sent Events)
    GET  /v1/models, /health (200 serving, 503 not), /metrics (Prometheus text)
    POST /tokenize, /detokenize                        (vLLM's shapes: tokenize.py)

With an API key every /v1 route and /tokenize, /detokenize want `Authorization: Bearer <key>`. Errors are OpenAI's
{"error": {message, type, param, code}} with the HTTP status of errors.STATUS_TO_HTTP.
"""
import asyncio
import contextlib
import hmac
import json

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from .choices import Choices
from .errors import ApiError, bad_request
from .metrics import Metrics
from .protocol import chat_choices, check_model, completion_choices
from .responses import Answer
from .tokenize import tokenize_routes

def create_app(served, api_key=None) -> FastAPI:
    """served: a ServedModel (loading or serving); api_key: required on /v1 routes when set."""
    metrics = Metrics(served)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.ensure_future(metrics.log_throughput())
        yield
        task.cancel()
    app = FastAPI(title="dashinfer", docs_url=None, redoc_url=None, lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return JSONResponse(e.body(), status_code=e.http_status)

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        return JSONResponse(ApiError(e.status_code, str(e.detail), "invalid_request_error").body(),
                            status_code=e.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, e):
        return JSONResponse(bad_request(str(e)).body(), status_code=400)

    async def check_key(request: Request):
        if api_key:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                raise ApiError(401, "invalid or missing API key (Authorization: Bearer <key>)",
                               "authentication_error", code="invalid_api_key")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    @app.get("/health")
    async def health():
        ok, why = await asyncio.to_thread(served.health)
        return JSONResponse({"status": "ok" if ok else served.state, "message": why},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus():
        body = await asyncio.to_thread(metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @v1.get("/models")
    async def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": 0,
                                            "owned_by": "dashinfer", "max_model_len": served.max_length,
                                            "sampling_defaults": served.sampling_defaults}]}

    async def complete(request: Request, parse):
        body = await _json(request)
        check_model(body, served)
        jobs = parse(body, served)
        answer = Answer(jobs[0], lambda i: served.tokenizer.decode([i]))
        choices = Choices(served, jobs, metrics, answer.id)
        if answer.job.stream:
            firsts = await choices.first_pieces()  # a refusal is still an HTTP error, not a stream
            return StreamingResponse(choices.events(answer, firsts), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        collected = await _unless_disconnected(request, choices.whole())
        return answer.whole(collected, choices.usage()) if collected is not None else Response(status_code=499)

    @v1.post("/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat_choices)

    @v1.post("/completions")
    async def completions(request: Request):
        return await complete(request, completion_choices)

    app.include_router(v1)
    app.include_router(tokenize_routes(served, _json, check_key))
    return app


async def _json(request) -> dict:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


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
