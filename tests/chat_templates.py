"""Chat templates of the tiny test tokenizers: plain ChatML, ChatML with <think>, Qwen2.5/Hermes
style tool calls (with and without a tool round trip), Qwen3's reasoning history and gpt-oss's
harmony, with the special tokens each needs."""
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# ChatML whose assistant turn opens the reasoning (Qwen3's convention: enable_thinking=False writes
# an empty one instead), for the reasoning parser's tests.
THINK_CHATML = CHATML.replace("{{ '<|im_start|>assistant\n' }}",
                              "{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and not "
                              "enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% else %}{{ '<think>\n' }}"
                              "{% endif %}")

# ChatML that renders tools as Qwen2.5 / Hermes templates do (a system turn listing them and the
# <tool_call> format, which selects the hermes parser), for the tool-call streaming tests.
HERMES_CHATML = ("{% if tools %}{{ '<|im_start|>system\nCall a function as <tool_call>{\"name\": ..., "
                 "\"arguments\": ...}</tool_call>. Functions:\n' }}{% for tool in tools %}{{ tool | tojson }}"
                 "{{ '\n' }}{% endfor %}{{ '<|im_end|>\n' }}{% endif %}" + CHATML)

# ChatML that writes a conversation's tool round trip as Qwen3 / Hermes templates do: the tools in a
# system turn, an assistant's calls as <tool_call> blocks of JSON (arguments as given: JSON text,
# or an object written with tojson), a tool result as a user turn in <tool_response>; for the
# pipeline's tool round trip.
HERMES_ROUND_TRIP = (
    "{% if tools %}{{ '<|im_start|>system\\nCall a function as <tool_call>{\"name\": ..., \"arguments\": ...}"
    "</tool_call>. Functions:\\n' }}{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'assistant' and message.tool_calls %}{{ '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{% for call in message.tool_calls %}{{ '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{% if call.function.arguments is string %}{{ call.function.arguments }}{% else %}"
    "{{ call.function.arguments | tojson }}{% endif %}{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif message.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + message.content + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# Qwen3's template as it treats reasoning: an assistant turn's `reasoning_content` (else what its
# content holds before </think>) is written in <think> only after the last user query (a tool-call
# loop), earlier reasoning is dropped; the answer's turn opens at <|im_start|>assistant (the model
# writes <think>), enable_thinking=False writes an empty one. Calls and results as HERMES_ROUND_TRIP.
QWEN3 = (
    "{% if tools %}{{ '<|im_start|>system\\nCall a function as <tool_call>{\"name\": ..., \"arguments\": ...}"
    "</tool_call>. Functions:\\n' }}{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{% set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{% for message in messages[::-1] %}{% set index = (messages|length - 1) - loop.index0 %}"
    "{% if ns.multi_step_tool and message.role == 'user' and message.content is string and "
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}"
    "{% set ns.multi_step_tool = false %}{% set ns.last_query_index = index %}{% endif %}{% endfor %}"
    "{% for message in messages %}{% set content = message.content if message.content is string else '' %}"
    "{% if message.role == 'assistant' %}{% set reasoning_content = '' %}"
    "{% if message.reasoning_content is string %}{% set reasoning_content = message.reasoning_content %}"
    "{% elif '</think>' in content %}"
    "{% set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{% if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
    "{{ '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + "
    "content.lstrip('\\n') }}{% else %}{{ '<|im_start|>assistant\\n' + content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}{% if content or not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{% if call.function.arguments is string %}{{ call.function.arguments }}{% else %}"
    "{{ call.function.arguments | tojson }}{% endif %}{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif message.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + content + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% endif %}{% endif %}")

# gpt-oss's harmony format, written small: a system turn with the reasoning effort, the tools as a
# developer turn's TypeScript-like namespace, past calls on the commentary channel to
# functions.NAME (after their reasoning on the analysis channel: the message's `thinking`, or its
# content, never both, as gpt-oss's template takes them, until a final answer follows),
# results from functions.NAME; the answer opens at <|start|>assistant. Its markers
# are special tokens of the tokenizer (HARMONY_TOKENS; tiny_with_template(..., HARMONY_TOKENS)).
HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
HARMONY = (
    "{{ '<|start|>system<|message|>You are a tiny model.\\nReasoning: ' + (reasoning_effort if reasoning_effort "
    "is defined else 'medium') + '\\n# Valid channels: analysis, commentary, final.<|end|>' }}"
    "{% if tools %}{{ '<|start|>developer<|message|># Tools\\nnamespace functions {\\n' }}{% for tool in tools %}"
    "{{ '// ' + (tool.function.description or '') + '\\ntype ' + tool.function.name + ' = (_: ' }}"
    "{{ tool.function.parameters | tojson }}{{ ') => any;\\n' }}{% endfor %}{{ '} // namespace functions<|end|>' }}"
    "{% endif %}{% for message in messages %}"
    "{% if message.role == 'assistant' and message.tool_calls %}{% set answered = namespace(found=false) %}"
    "{% for later in messages[loop.index:] %}{% if later.role == 'assistant' and 'tool_calls' not in later %}"
    "{% set answered.found = true %}{% endif %}{% endfor %}"
    "{% if message.content and message.thinking %}{{ raise_exception('Cannot pass both content and thinking in an "
    "assistant message with tool calls!') }}{% elif (message.content or message.thinking) and not answered.found %}"
    "{{ '<|start|>assistant<|channel|>analysis<|message|>' + (message.content or message.thinking) + '<|end|>' }}"
    "{% endif %}{% for call in message.tool_calls %}"
    "{{ '<|start|>assistant<|channel|>commentary to=functions.' + call.function.name + ' <|constrain|>json<|message|>' }}"
    "{% if call.function.arguments is string %}{{ call.function.arguments }}{% else %}"
    "{{ call.function.arguments | tojson }}{% endif %}{{ '<|call|>' }}{% endfor %}"
    "{% elif message.role == 'tool' %}{{ '<|start|>functions.' + message.name + ' to=assistant<|channel|>commentary"
    "<|message|>' + message.content + '<|end|>' }}"
    "{% elif message.role == 'assistant' %}{{ '<|start|>assistant<|channel|>final<|message|>' + message.content + "
    "'<|end|>' }}"
    "{% else %}{{ '<|start|>' + message.role + '<|message|>' + message.content + '<|end|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}")
