"""Text inside a lark grammar (llguidance's dialect), the tokenizer's added tokens written as tokens.

llguidance reads every added token of a tokenizer, special (Mistral's [TOOL_CALLS], gpt-oss's
<|channel|>) or not (Qwen's <tool_call>, QwQ's </think>), as a token of its own and never as its
text: a grammar that spells such a text out is offered that token (the tokenizer's encoding of the
text) and then refuses it. The model was trained to write the token anyway. The forced-call grammars
(frontend/parsers) and the reasoning bounds of guided decoding (dashinfer_server/guided.py) write
their markers here.
"""
import json
import re


def lark_text(text: str, added: dict) -> str:
    """text as lark items that match it alone: each added token's text in it (`added`: the added
    tokens' texts -> ids) as that token, the rest as string literals."""
    return " ".join(f"<[{added[p]}]>" if p in added else json.dumps(p) for p in added_pieces(text, added))


def added_pieces(text: str, added: dict) -> list:
    """text cut into the added tokens' texts it holds and the text between them (no empty piece)."""
    inside = sorted((t for t in added if t and t in text), key=len, reverse=True)
    if not inside:
        return [text]
    return [p for p in re.split("(" + "|".join(map(re.escape, inside)) + ")", text) if p]
