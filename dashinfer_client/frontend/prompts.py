"""The input side of every front door: a conversation (with tools and template options) or a text
-> the prompt's token ids, through the model's own chat template and tokenizer.

Messages come in one normalized form, whatever API they arrived by:
    {"role": "system" | "user" | "assistant" | "tool", "content": str,
     "tool_calls": [{"id", "name", "arguments": dict}],  (assistant, optional)
     "reasoning": str                                    (assistant, optional)
     "tool_call_id": str, "name": str}                    (tool)
A template that renders tools itself gets them, and the history's calls in Hugging Face's shape;
for one that knows no tools the tool-call format (parsers/) describes them in a system message
and writes the history's calls and results as ordinary turns. An assistant turn's reasoning goes to
the template under each name templates read it by (vLLM gives `reasoning` and `reasoning_content`,
which Qwen3's reads; gpt-oss's reads `thinking`); the template decides what it keeps.
"""
import functools

from ..tokenizer import added_tokens
from .messages import REASONING_KEYS, PromptError
from .parsers import reasoning_parser_for, tool_parser_for


class Prompts:
    """tokenizer: the model's; tool_parser / reasoning_parser: a registered name to override what
    the chat template says (None: from the template)."""

    def __init__(self, tokenizer, tool_parser=None, reasoning_parser=None):
        self.tokenizer = tokenizer
        template = getattr(tokenizer, "chat_template", None)
        named = template if isinstance(template, dict) else {"default": template if isinstance(template, str) else None}
        # named templates (Hermes-3's): a request with tools is rendered by "tool_use", as
        # transformers chooses, so its calls come in that template's format
        self.tool_format = tool_parser_for(named.get("tool_use") or named.get("default") or "", tool_parser)
        self.reasoning_format = reasoning_parser_for(named.get("default") or "", reasoning_parser)

    def chat_text(self, messages, tools=None, template_kwargs=None, continue_final=False, open_turn=True) -> str:
        """The conversation through the chat template, the assistant's turn opened (open_turn: the
        template's generation prompt). continue_final: the final message, the assistant's, is left
        open instead, for the model to continue (a prefill); not with open_turn. tools: OpenAI function
        definitions ({"name", "description", "parameters"})."""
        if continue_final and messages[-1]["role"] != "assistant":
            raise PromptError(f"the final message, to be continued, must be the assistant's, not the "
                              f"{messages[-1]['role']}'s")
        fmt = self.tool_format
        if fmt.template_renders_tools:
            turns = [_hf_message(m, fmt.reasoning_or_content) for m in messages]
            rendered_tools = [{"type": "function", "function": f} for f in tools] if tools else None
        else:
            turns = _plain_turns(messages, fmt)
            rendered_tools = None
            if tools:
                system = fmt.describe(tools)
                if turns and turns[0]["role"] == "system":
                    turns[0] = {"role": "system", "content": turns[0]["content"] + "\n\n" + system}
                else:
                    turns.insert(0, {"role": "system", "content": system})
        try:
            return self.tokenizer.apply_chat_template(turns, tools=rendered_tools, tokenize=False,
                                                      add_generation_prompt=open_turn and not continue_final,
                                                      continue_final_message=continue_final,
                                                      **(template_kwargs or {}))
        except Exception as e:  # a template that refuses the conversation (roles out of order...)
            raise PromptError(f"the model's chat template refused the messages: {e}") from None

    def chat_ids(self, messages, tools=None, template_kwargs=None) -> list:
        return self.text_ids(self.chat_text(messages, tools, template_kwargs), special=False)

    def text_ids(self, text, special=True) -> list:
        """special: with the model's special tokens (BOS), as the engine's own tokenization does;
        a chat template writes its own."""
        return self.tokenizer(text, add_special_tokens=special)["input_ids"]

    def word_ids(self, words) -> list:
        """Each string's token sequence (stop words), empty ones dropped."""
        return [seq for seq in (self.text_ids(w, special=False) for w in words or ()) if seq]

    def tool_parser(self, tools):
        """A fresh parser of the answer's tool calls when the request offers tools or the format
        parses every answer (harmony), else None."""
        return self.tool_format.for_functions(tools or ()) if tools or self.tool_format.always else None

    def forced_call_grammar(self, functions, parallel) -> str:
        """The lark grammar of an answer that is only calls of `functions` (tool_choice required or
        named), its markers the tokenizer's added tokens where it has them (lark_text)."""
        return self.tool_format.grammar(functions, parallel, self._added_tokens)

    @functools.cached_property
    def _added_tokens(self) -> dict:
        return added_tokens(self.tokenizer)  # the tokenizer's own: read once, on the first forced call

    def reasoning_parser(self, prompt_text=""):
        """A fresh reasoning parser, or None when the model has none; it starts inside the reasoning
        when the prompt already opened it."""
        fmt = self.reasoning_format
        return None if fmt is None else fmt(inside=self._opens_reasoning(prompt_text))

    def reasoning_bounds(self, prompt_text, calls=False) -> dict:
        """Where a constrained answer (response_format; forced tool calls: `calls`) may reason first,
        as response_format's reasoning_start / reasoning_end / answer_start: after a prompt that
        opened <think>, up to its closer; where the model opens it itself (Qwen3 with thinking on),
        an optional <think> block; nothing where the prompt closed it (thinking off) or the model has
        no such format. Harmony: an optional analysis message, then the final channel of a JSON answer
        or the commentary channel a forced call's grammar writes itself. Else the reasoning would be
        forbidden, or the answer written, and read, as reasoning."""
        fmt = self.reasoning_format
        if fmt is not None and fmt.answer_bounds is not None:
            return {k: v for k, v in fmt.answer_bounds.items() if not (calls and k == "answer_start")}
        if fmt is None or fmt.closer is None:
            return {}
        if self._opens_reasoning(prompt_text):
            return {"reasoning_end": fmt.closer}
        if prompt_text.rstrip().endswith(fmt.closer):
            return {}
        return {"reasoning_start": fmt.opener, "reasoning_end": fmt.closer}

    def _opens_reasoning(self, prompt_text) -> bool:
        fmt = self.reasoning_format
        return fmt is not None and prompt_text.rstrip().endswith(fmt.markers[0])


def _hf_message(m, reasoning_or_content=False) -> dict:
    """A normalized message in the shape Hugging Face chat templates read (reasoning_or_content: a
    call turn with both goes without its content, which the template would refuse)."""
    both = reasoning_or_content and m.get("tool_calls") and m.get("reasoning") and m.get("content")
    out = {"role": m["role"], "content": "" if both else m.get("content", "")}
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for c in m["tool_calls"]]
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            out[key] = m[key]
    return dict(out, **_reasoning(m))


def _reasoning(m) -> dict:
    """An assistant turn's reasoning under every name a template reads it by (none: no key)."""
    return {} if m.get("reasoning") is None else dict.fromkeys(REASONING_KEYS, m["reasoning"])


def _plain_turns(messages, fmt) -> list:
    """Messages for a template that knows no tools: a call as the text the model would have written,
    a result as a user turn that names its function."""
    turns = []
    for m in messages:
        content = m.get("content", "")
        if m["role"] == "tool":
            turns.append({"role": "user", "content": f"Result of {m.get('name') or 'the function'}: {content}"})
        elif m.get("tool_calls"):
            calls = fmt.text_of([{"name": c["name"], "arguments": c["arguments"]} for c in m["tool_calls"]])
            turns.append({"role": "assistant", "content": (content + "\n" if content else "") + calls, **_reasoning(m)})
        else:
            turns.append({"role": m["role"], "content": content, **_reasoning(m)})
    return turns
