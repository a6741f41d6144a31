"""ChatTemplateConfig and the prompt text of a conversation.

By default a conversation is formatted by the model's own chat template (its tokenizer's
apply_chat_template). ChatTemplateConfig(model_name='chatml' | 'qwen' | 'llama3') picks a built-in
template instead; the role markers (system, eosys, user, eoh, assistant, eoa, separator) make a
custom one; meta_instruction is a system prompt, put first when the conversation has none.
"""
from dataclasses import dataclass, field, fields
from typing import List, Optional

from ..frontend.messages import template_kwargs as checked_template_kwargs, tool_functions

MARKERS = ("system", "eosys", "user", "eoh", "assistant", "eoa", "separator")
_CHATML = dict(system="<|im_start|>system\n", eosys="<|im_end|>\n", user="<|im_start|>user\n",
               eoh="<|im_end|>\n", assistant="<|im_start|>assistant\n", eoa="<|im_end|>", separator="\n",
               stop_words=["<|im_end|>"])
BUILTIN = {
    "chatml": _CHATML,
    "qwen": dict(_CHATML, meta_instruction="You are a helpful assistant."),
    "llama3": dict(system="<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n",
                   eosys="<|eot_id|>", user="<|start_header_id|>user<|end_header_id|>\n\n",
                   eoh="<|eot_id|>", assistant="<|start_header_id|>assistant<|end_header_id|>\n\n",
                   eoa="<|eot_id|>", separator="", stop_words=["<|eot_id|>"]),
}
ROLES = ("system", "user", "assistant")  # what ChatTemplateConfig's markers write


@dataclass
class ChatTemplateConfig:
    model_name: Optional[str] = None
    system: Optional[str] = None
    meta_instruction: Optional[str] = None
    eosys: Optional[str] = None
    user: Optional[str] = None
    eoh: Optional[str] = None
    assistant: Optional[str] = None
    eoa: Optional[str] = None
    separator: Optional[str] = None
    capability: Optional[str] = None
    stop_words: Optional[List[str]] = None

    def __post_init__(self):
        if self.model_name is not None and self.model_name not in BUILTIN:
            raise ValueError(f"ChatTemplateConfig.model_name={self.model_name!r} is not a built-in template "
                             f"({', '.join(BUILTIN)}); None uses the model's own chat template")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "stop_words" and value is not None and not isinstance(value, str):
                raise ValueError(f"ChatTemplateConfig.{f.name} must be a str or None, got {value!r}")
        if self.capability not in (None, "chat", "completion"):
            raise ValueError(f"ChatTemplateConfig.capability must be 'chat' or 'completion', got {self.capability!r}")

    def markers(self):
        """The role markers of a built-in or custom template, or None for the model's own."""
        base = dict(BUILTIN.get(self.model_name, {}))
        given = {name: getattr(self, name) for name in MARKERS if getattr(self, name) is not None}
        if not base and not given:
            return None
        merged = {name: "" for name in MARKERS}
        merged.update({k: v for k, v in base.items() if k in MARKERS}, **given)
        return merged

    def system_prompt(self):
        return self.meta_instruction if self.meta_instruction is not None else BUILTIN.get(
            self.model_name, {}).get("meta_instruction")

    def template_stop_words(self):
        return self.stop_words if self.stop_words is not None else BUILTIN.get(self.model_name, {}).get("stop_words")


@dataclass
class ChatOptions:
    """What a call gives the chat template beside the conversation, as LMDeploy's pipeline takes it:
    tools (OpenAI's [{"type": "function", "function": {...}}], checked into functions), and
    chat_template_kwargs, where enable_thinking and reasoning_effort go unless it names them."""
    functions: Optional[list] = None
    template_kwargs: dict = field(default_factory=dict)

    @classmethod
    def of(cls, tools, chat_template_kwargs, enable_thinking, reasoning_effort) -> "ChatOptions":
        return cls(tool_functions(tools) if tools is not None else None,
                   checked_template_kwargs(chat_template_kwargs, enable_thinking, reasoning_effort))


def prompt_text(prompts, messages, config: ChatTemplateConfig, functions=None, template_kwargs=None):
    """The prompt of a conversation (normalized messages: frontend/messages.py), the assistant's turn
    opened (prompts: the front end's Prompts, whose chat_text is the model's own template, which
    alone renders tools, past calls and template options)."""
    system = config.system_prompt()
    if system is not None and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system}] + list(messages)
    markers = config.markers()
    if markers is None:
        return prompts.chat_text(messages, functions, template_kwargs)
    if functions or template_kwargs or any(m["role"] not in ROLES or m.get("tool_calls") for m in messages):
        raise ValueError("tools, tool calls and results, and chat template options need the model's own chat "
                         "template, not ChatTemplateConfig's markers")
    parts = []
    for m in messages:
        begin, end = {"system": ("system", "eosys"), "user": ("user", "eoh"),
                      "assistant": ("assistant", "eoa")}[m["role"]]
        parts.append(markers[begin] + m["content"] + markers[end]
                     + (markers["separator"] if m["role"] == "assistant" else ""))
    return "".join(parts) + markers["assistant"]
