"""POST /tokenize and POST /detokenize in vLLM's shapes, with the served model's own tokenizer:

    /tokenize    {"prompt": str, "add_special_tokens": true}          the text as /v1/completions reads it
                 {"messages": [...], "add_generation_prompt": true,    the conversation as /v1/chat/completions
                  "continue_final_message": false}                     reads it (the model's chat template)
              -> {"count": N, "max_model_len": L, "tokens": [ids], "token_strs": [str] or null}
                 (token_strs with "return_token_strs": true)
    /detokenize  {"tokens": [ids]} -> {"prompt": str}

"model", when given, must be the served one. No engine call: the tokenizer runs in a worker thread.
"""
import asyncio

from fastapi import APIRouter, Depends, Request

from .errors import bad_request
from .protocol import chat_prompt, check_model, flag


def tokenize_routes(served, read_json, check_key) -> APIRouter:
    """The two routes; read_json(request) -> the body (a dict); check_key: the API key dependency."""
    router = APIRouter(dependencies=[Depends(check_key)])

    @router.post("/tokenize")
    async def tokenize(request: Request):
        body = await read_json(request)
        check_model(body, served)
        ids = await asyncio.to_thread(_tokens, served, body)
        strs = served.tokenizer.convert_ids_to_tokens(ids) if flag(body, "return_token_strs") else None
        return {"count": len(ids), "max_model_len": served.max_length, "tokens": ids, "token_strs": strs}

    @router.post("/detokenize")
    async def detokenize(request: Request):
        body = await read_json(request)
        check_model(body, served)
        ids = body.get("tokens")
        vocab = served.loader.config.vocab_size
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                                for t in ids):
            raise bad_request("'tokens' must be a list of token ids of the model's vocabulary", "tokens")
        return {"prompt": await asyncio.to_thread(served.tokenizer.decode, ids)}

    return router


def _tokens(served, body) -> list:
    if ("prompt" in body) == ("messages" in body):
        raise bad_request("give either 'prompt' (a string) or 'messages' (a conversation)")
    if "messages" in body:
        return served.prompts.text_ids(chat_prompt(body, served)[0], special=False)
    prompt = body["prompt"]
    if not isinstance(prompt, str):
        raise bad_request("'prompt' must be a string", "prompt")
    special = body.get("add_special_tokens", True)
    if not isinstance(special, bool):
        raise bad_request("'add_special_tokens' must be true or false", "add_special_tokens")
    return served.prompts.text_ids(prompt, special)
