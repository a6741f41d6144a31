"""The reasoning parsers (dashinfer_client/frontend/parsers: think, granite, seed_oss) on answers
written by hand as each family writes them, fed whole and split at every character: the same
reasoning and content come out, and no tag leaks into either."""
import pytest

from dashinfer_client.frontend.parsers import REASONING_PARSERS


THINK = [
    ("<think>\nWeigh it.\n</think>\n\nThe answer is 4.", False, "\nWeigh it.\n", "The answer is 4."),
    ("Just 4.", False, "", "Just 4."),
    ("Weigh it. </think>4", True, "Weigh it. ", "4"),     # the template opened the tag in the prompt
    ("<think>never closed", False, "never closed", ""),   # cut by max_tokens: all reasoning
    ("4 <think>not at the start</think>", False, "", "4 <think>not at the start</think>"),
]
SEED_THINK = [
    ("<seed:think>Weigh it.<seed:cot_budget_reflect>50 tokens left</seed:cot_budget_reflect></seed:think>4",
     False, "Weigh it.<seed:cot_budget_reflect>50 tokens left</seed:cot_budget_reflect>", "4"),
    ("<think>not Seed's</think>4", False, "", "<think>not Seed's</think>4"),
]


# Granite 3.3 thinking (IBM granite-io's reading): the reasoning as think's, the content without <response>
GRANITE_THINK = [
    ("<think>Weigh it.</think><response>It is 4.</response>", False, "Weigh it.", "It is 4."),
    ("<think>Weigh it.</think>\n<response>\nIt is <b>4</b>.\n</response>", False, "Weigh it.", "\nIt is <b>4</b>.\n"),
    ("<response>It is 4.</response>", False, "", "It is 4."),           # thinking off, the wrapper kept
    ("It is 4.", False, "", "It is 4."),
    ("<think>a</think><response>b </respo", False, "a", "b </respo"),   # cut by max_tokens inside the tag
    ("<think>never closed", False, "never closed", ""),
    ("4 <response>not at the start</response>", False, "", "4 <response>not at the start</response>"),
]


# Hunyuan's (vLLM's hunyuan_a13b reading): the reasoning, then the answer in <answer>...</answer>
HUNYUAN_THINK = [
    ("<think>\nWeigh it.\n</think>\n<answer>\nIt is 4.\n</answer>", False, "\nWeigh it.\n", "\nIt is 4.\n"),
    ("<answer>It is 4.</answer>", False, "", "It is 4."),               # thinking off
    ("It is 4.", False, "", "It is 4."),
    ("<think>a</think><answer>b </ans", False, "a", "b </ans"),          # cut by max_tokens inside the tag
    ("4 <answer>not at the start</answer>", False, "", "4 <answer>not at the start</answer>"),
]


@pytest.mark.parametrize("fmt, answer, inside, reasoning, content",
                         [("think", *case) for case in THINK] + [("granite", *case) for case in GRANITE_THINK]
                         + [("seed_oss", *case) for case in SEED_THINK]
                         + [("hunyuan", *case) for case in HUNYUAN_THINK])
def test_think_split_everywhere(fmt, answer, inside, reasoning, content):
    for chunks in [[answer], list(answer)] + [[answer[:k], answer[k:]] for k in range(1, len(answer))]:
        parser = REASONING_PARSERS[fmt](inside=inside)
        parts = [parser.feed(c) for c in chunks] + [parser.finish()]
        assert "".join(r for r, _ in parts) == reasoning and "".join(c for _, c in parts) == content, chunks


# vLLM's parser names (its --tool-call-parser / --reasoning-parser choices) for the formats served here
VLLM_NAMES = [("--reasoning-parser", "qwen3", "think"), ("--reasoning-parser", "deepseek_r1", "think"),
              ("--reasoning-parser", "glm45", "think"), ("--reasoning-parser", "ernie45", "think"),
              ("--reasoning-parser", "openai_gptoss", "harmony"), ("--tool-call-parser", "openai", "harmony"),
              ("--reasoning-parser", "minimax_m2", "think"), ("--tool-call-parser", "glm47", "glm45")]


@pytest.mark.parametrize("flag,vllm,ours", VLLM_NAMES)
def test_a_vllm_command_lines_parser_names_are_taken(flag, vllm, ours):
    """`dashinfer serve` takes the name (argparse's choices) and it picks the same format as ours."""
    from dashinfer_client.frontend.parsers import reasoning_parser_for, tool_parser_for
    from dashinfer_server.cli import build_parser
    args = build_parser().parse_args(["serve", flag, vllm])
    pick = reasoning_parser_for if flag == "--reasoning-parser" else tool_parser_for
    chosen = getattr(args, flag.lstrip("-").replace("-", "_"))
    assert pick(None, chosen) is pick(None, ours)
