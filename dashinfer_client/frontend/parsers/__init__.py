"""Tool-call and reasoning parsers, one small registered class per model format, and the choice
of one for a chat template (or by name: `dashinfer serve --tool-call-parser / --reasoning-parser`).

    qwen3_coder   <tool_call><function=NAME>                Qwen3-Coder, Qwen3.5-style templates
                  <parameter=ARG>VALUE</parameter>...
    seed_oss      the same in <seed:tool_call>              Seed-OSS (its reasoning parser too:
                                                            <seed:think>...</seed:think>)
    glm45         <tool_call>NAME                           GLM-4.5, GLM-4.6, GLM-4.7 (also named glm47;
                  <arg_key>ARG</arg_key>                    4.7 writes it without the newlines)
                  <arg_value>VALUE</arg_value>...</tool_call>
    minimax_m2    <minimax:tool_call>                       MiniMax-M2, M2.1 (its reasoning: think)
                  <invoke name="NAME">
                  <parameter name="ARG">VALUE</parameter>...
                  </invoke>...</minimax:tool_call>
    hermes        <tool_call>{...}</tool_call>              Qwen2.5, Qwen3, Hermes
    llama3_json   {"name", "parameters"}                    Llama 3.1+
    mistral       [TOOL_CALLS][{...}]                       Mistral
    granite       <|tool_call|>[{...}]                      Granite 3.x
    json          {"name", "arguments"} (tools in the prompt)  templates that know no tools
    harmony       <|channel|>commentary to=functions.NAME ... gpt-oss (its reasoning parser too:
                  <|message|>{...}<|call|>                  the analysis channel)
    think         <think>...</think>                        reasoning of Qwen3, GLM-4.5+, MiniMax-M2, DeepSeek-R1
                                                            distills
    granite       <think>...</think><response>...</response>  Granite 3.3's reasoning (its tool parser too)
    hunyuan       <think>...</think><answer>...</answer>    Hunyuan's reasoning (also named hunyuan_a13b)

A parser may go by other names too (`aliases`: vLLM's, so its command lines carry over: openai and
openai_gptoss for harmony, qwen3 / deepseek_r1 / glm45 / ernie45 / minimax_m2 for think).

Every format but harmony, glm45 and minimax_m2 reads the text as the user sees it (special tokens
skipped); harmony's markers are special tokens, and GLM's and MiniMax's may be, so their parsers ask
for them (`special_tokens`).
"""
# They register themselves, in the order the template test tries them (the first whose markers the
# template holds): qwen3_coder and glm45 before hermes, whose <tool_call> their templates hold too
# (minimax_m2's <minimax:tool_call> is no other's marker).
from . import generic_json, granite, harmony, qwen3_coder, glm45, minimax_m2, hermes, llama3, mistral, think  # noqa: F401,I001
from .base import REASONING_PARSERS, TOOL_PARSERS, ToolCall, ToolParser

__all__ = ["REASONING_PARSERS", "TOOL_PARSERS", "ToolCall", "ToolParser", "tool_parser_for",
           "reasoning_parser_for"]


def tool_parser_for(template, name=None):
    """The ToolParser class by name, else the one whose markers the chat template holds (_spoken),
    else the generic JSON format. ValueError for an unknown name."""
    if name is not None:
        return _named(TOOL_PARSERS, name, "tool-call parser")
    return _spoken(TOOL_PARSERS, template) or TOOL_PARSERS["json"]


def reasoning_parser_for(template, name=None):
    """The reasoning parser class by name ("none": no parsing), else the one the template speaks
    (_spoken), else None."""
    if name is not None:
        return None if name == "none" else _named(REASONING_PARSERS, name, "reasoning parser")
    return _spoken(REASONING_PARSERS, template)


def _spoken(registry, template):
    """The first parser (in registration order) whose markers the template holds, a subclass over its
    base where the template holds the markers of both (Granite 3.3's holds <think> too, Seed-OSS's
    Qwen3-Coder's <function=); None where none."""
    spoken = [cls for cls in registry.values() if any(m in (template or "") for m in cls.markers)]
    return next((cls for cls in spoken if not any(other is not cls and issubclass(other, cls) for other in spoken)),
                None)


def _named(registry, name, what):
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(registry))}")
    return registry[name]
