"""dashinfer_client.tokenizer (tokenizers + jinja2) against transformers' AutoTokenizer on the same
files: ids, text, chat template, special tokens; and serving without torch or transformers."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from dashinfer_client import default_model
from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, GGUFModel, HuggingFaceModel
from dashinfer_client.tokenizer import Tokenizer, supports
from tests.gguf_builders import build_tiny_gguf
from tests.chat_templates import CHATML, HERMES_CHATML
from tests.helpers import build_tiny_model, build_tiny_tokenizer, serialize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = ["Hello, world!", "", "  leading spaces, tabs\tand\nnew lines\n\n", "é, 日本語, emoji 🙂 and ß",
         "<|im_start|>user\nspecial tokens inside text<|im_end|>\n", "<|endoftext|>x<|im_end|><|im_end|>"]
CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "2+2?"}],
         [{"role": "user", "content": "a tool result follows", "tool_calls": None}]]


def _tiny_dir(tmp_path, post_processor=None, **config):
    """The tests' tiny tokenizer, its tokenizer_config.json edited by `config`."""
    path = build_tiny_tokenizer(str(tmp_path / "tok"))
    if post_processor:
        from tokenizers import Tokenizer as Backend
        backend = Backend.from_file(os.path.join(path, "tokenizer.json"))
        backend.post_processor = post_processor
        backend.save(os.path.join(path, "tokenizer.json"))
    cfg_path = os.path.join(path, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg.update(config)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    return path


def _default_model_tokenizer_dir():
    model_dir, prefix = default_model.ensure_default_model("bfloat16", progress=False)
    return os.path.join(model_dir, prefix + ".tokenizer")


@pytest.fixture(params=["tiny", "tiny-bos-eos", "smollm2"])
def pair(request, tmp_path):
    """(ours, transformers') on one tokenizer directory."""
    from transformers import AutoTokenizer
    if request.param == "tiny":
        path = _tiny_dir(tmp_path)
    elif request.param == "tiny-bos-eos":  # tokenizer.json's post-processor adds them, not the flags
        from tokenizers import processors
        adds = processors.TemplateProcessing(single="<|im_start|> $A <|im_end|>", pair="$A $B",
                                             special_tokens=[("<|im_start|>", 1), ("<|im_end|>", 2)])
        path = _tiny_dir(tmp_path, adds, add_bos_token=False, add_eos_token=True)
        assert Tokenizer(path).encode("x") == [1, Tokenizer(path).encode("x", add_special_tokens=False)[0], 2]
    else:
        path = _default_model_tokenizer_dir()
    assert supports(path)
    return Tokenizer(path), AutoTokenizer.from_pretrained(path)


def test_same_ids(pair):
    ours, ref = pair
    for text in TEXTS:
        for special in (True, False):
            assert ours(text, add_special_tokens=special)["input_ids"] == \
                ref(text, add_special_tokens=special)["input_ids"], (text, special)
            assert ours.encode(text, add_special_tokens=special) == ref.encode(text, add_special_tokens=special)
    assert ours(TEXTS)["input_ids"] == ref(TEXTS)["input_ids"]


def test_same_text(pair):
    ours, ref = pair
    for text in TEXTS:
        ids = ref.encode(text)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
    assert ours.batch_decode([ref.encode(t) for t in TEXTS], skip_special_tokens=True) == \
        ref.batch_decode([ref.encode(t) for t in TEXTS], skip_special_tokens=True)
    assert ours.decode(ref.encode("x")[-1]) == ref.decode(ref.encode("x")[-1])  # one int


def test_same_chat_template(pair):
    ours, ref = pair
    for chat in CHATS:
        for prompt in (True, False):
            text = ours.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
            assert text == ref.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
            assert ours.apply_chat_template(chat, add_generation_prompt=prompt) == \
                dict(ref.apply_chat_template(chat, add_generation_prompt=prompt))
            assert ours.apply_chat_template(chat, add_generation_prompt=prompt, return_dict=False) == \
                ref.apply_chat_template(chat, add_generation_prompt=prompt, return_dict=False)
    assert text.endswith("<|im_end|>\n") and "assistant\n" not in text[-12:]


def test_same_continued_final_message(pair):
    """continue_final_message (a prefill): the final message left open, cut as transformers cuts it,
    its trailing spaces kept or dropped as the template renders them."""
    ours, ref = pair
    for prefill in ("The capital of France is", "", "Ends in a space "):
        chat = CHATS[1][:3] + [{"role": "user", "content": "And?"}, {"role": "assistant", "content": prefill}]
        text = ours.apply_chat_template(chat, continue_final_message=True, tokenize=False)
        assert text == ref.apply_chat_template(chat, continue_final_message=True, tokenize=False), prefill
        assert ours.apply_chat_template(chat, continue_final_message=True, return_dict=False) == \
            ref.apply_chat_template(chat, continue_final_message=True, return_dict=False)
    assert text.rstrip().endswith("<|im_start|>assistant\nEnds in a space")  # no end of turn after it
    with pytest.raises(ValueError, match="not compatible"):
        ours.apply_chat_template(chat, continue_final_message=True, add_generation_prompt=True)


def test_same_special_tokens(pair):
    ours, ref = pair
    for name in ("bos", "eos", "unk", "pad"):
        assert getattr(ours, name + "_token") == getattr(ref, name + "_token")
        assert getattr(ours, name + "_token_id") == getattr(ref, name + "_token_id")
    assert ours.sep_token_id is None and ours.mask_token is None
    assert ours.all_special_ids == ref.all_special_ids and ours.all_special_tokens == ref.all_special_tokens
    assert ours.vocab_size == ref.vocab_size and len(ours) == len(ref)
    assert ours.convert_ids_to_tokens(ref.encode("Hi there")) == ref.convert_ids_to_tokens(ref.encode("Hi there"))


def test_template_errors_and_refusals(tmp_path):
    path = _tiny_dir(tmp_path)
    os.remove(os.path.join(path, "chat_template.jinja"))
    tok = Tokenizer(path)
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template(CHATS[0], tokenize=False)
    failing = "{{ raise_exception('only user turns') }}"
    import jinja2
    with pytest.raises(jinja2.exceptions.TemplateError, match="only user turns"):
        tok.apply_chat_template(CHATS[0], chat_template=failing, tokenize=False)
    with pytest.raises(ValueError, match="empty conversation"):
        tok.apply_chat_template([], chat_template=failing)
    with pytest.raises(ValueError, match="padding"):
        tok(["a", "bb"], padding=True)
    escape = "{{ messages.__class__.__mro__ }}"  # the sandbox: templates come from model hubs
    with pytest.raises(jinja2.exceptions.SecurityError):
        tok.apply_chat_template(CHATS[0], chat_template=escape, tokenize=False)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


NAMED = {"default": CHATML, "tool_use": HERMES_CHATML}  # Hermes-2-Pro's and Hermes-3's pair


def _named_templates(path, layout):
    """NAMED in `path`, as transformers 5 saves them (chat_template.jinja +
    additional_chat_templates/tool_use.jinja) or as a list in tokenizer_config.json (Hermes-3's)."""
    build_tiny_tokenizer(path, NAMED)
    assert os.path.isfile(os.path.join(path, "additional_chat_templates", "tool_use.jinja"))
    if layout == "files":
        return
    shutil.rmtree(os.path.join(path, "additional_chat_templates"))
    os.remove(os.path.join(path, "chat_template.jinja"))
    cfg_path = os.path.join(path, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["chat_template"] = [{"name": name, "template": template} for name, template in NAMED.items()]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)


@pytest.mark.parametrize("layout", ["files", "config-list"])
def test_named_chat_templates_are_chosen_as_transformers_chooses(tmp_path, layout):
    """With tools the "tool_use" template, else "default"; a template can be named."""
    from transformers import AutoTokenizer
    path = _tiny_dir(tmp_path)
    _named_templates(path, layout)
    ours, ref = Tokenizer(path), AutoTokenizer.from_pretrained(path)
    for kwargs in ({}, {"tools": TOOLS}, {"chat_template": "tool_use"}, {"chat_template": "default", "tools": TOOLS}):
        text = ours.apply_chat_template(CHATS[1], add_generation_prompt=True, tokenize=False, **kwargs)
        assert text == ref.apply_chat_template(CHATS[1], add_generation_prompt=True, tokenize=False, **kwargs), kwargs
    assert "get_weather" in ours.apply_chat_template(CHATS[0], tools=TOOLS, tokenize=False)


def test_a_conversion_keeps_the_named_chat_templates(tmp_path):
    from transformers import AutoTokenizer
    hf = build_tiny_model(str(tmp_path / "hf"))
    _named_templates(hf, "files")
    serialize(hf, tmp_path / "out").free_model()
    served = DashInferModel(str(tmp_path / "out"), "tiny").get_tokenizer()
    want = AutoTokenizer.from_pretrained(hf).apply_chat_template(CHATS[0], tools=TOOLS, tokenize=False)
    assert served.apply_chat_template(CHATS[0], tools=TOOLS, tokenize=False) == want


def test_the_tokenizer_config_template_comes_before_a_processor_chat_template_json(tmp_path):
    """transformers' tokenizer reads tokenizer_config.json's template and never chat_template.json (a
    processor's file); alone, chat_template.json still serves, as vLLM falls back to the processor's."""
    from transformers import AutoTokenizer
    path = _tiny_dir(tmp_path, chat_template=CHATML)
    os.remove(os.path.join(path, "chat_template.jinja"))
    with open(os.path.join(path, "chat_template.json"), "w") as f:
        json.dump({"chat_template": "processor: {{ messages[0].content }}"}, f)
    text = Tokenizer(path).apply_chat_template(CHATS[0], tokenize=False)
    assert text == AutoTokenizer.from_pretrained(path).apply_chat_template(CHATS[0], tokenize=False)
    cfg_path = os.path.join(path, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    with open(cfg_path, "w") as f:
        json.dump({k: v for k, v in cfg.items() if k != "chat_template"}, f)
    assert Tokenizer(path).apply_chat_template(CHATS[0], tokenize=False) == "processor: " + CHATS[0][0]["content"]


def test_model_handles_choose_the_light_tokenizer(tmp_path, monkeypatch):
    hf = build_tiny_model(str(tmp_path / "hf"))
    assert isinstance(HuggingFaceModel(hf, "tiny").get_tokenizer(), Tokenizer)
    model = DashInferModel(*default_model.ensure_default_model("bfloat16", progress=False))
    assert isinstance(model.get_tokenizer(), Tokenizer)
    assert model.get_tokenizer().padding_side == "left"
    # a tokenizer class that rebuilds the pipeline in Python is transformers' to read ...
    with open(os.path.join(hf, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "LlamaTokenizer"
    with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    assert not supports(hf)
    assert not isinstance(HuggingFaceModel(hf, "tiny").get_tokenizer(), Tokenizer)
    # ... and without transformers installed, the error names the extra to install
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ModelSerializerException, match=r"dashinfer-py\[convert\]"):
        HuggingFaceModel(hf, "tiny").get_tokenizer()


def test_conversions_that_need_the_convert_extra_say_so(tmp_path, monkeypatch):
    hf = build_tiny_model(str(tmp_path / "hf"))
    # a GGUF tokenizer kind gguf_tokenizer.py does not build (byte-level BPE and SentencePiece it does)
    gguf_path = build_tiny_gguf(tmp_path / "tiny.gguf", hf, tokenizer_model="bert")
    bin_dir = build_tiny_model(str(tmp_path / "bin"), weights="bin")
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ModelSerializerException, match=r"needs transformers.*dashinfer-py\[convert\]"):
        GGUFModel(str(gguf_path), "tiny").load_model().read_model_config().serialize_to_path(None, str(tmp_path / "g"))
    with pytest.raises(ModelSerializerException, match=r"needs torch.*dashinfer-py\[convert\]"):
        HuggingFaceModel(bin_dir, "tiny").load_model().read_model_config().serialize_to_path(None, str(tmp_path / "b"))
    # a safetensors checkpoint converts and serves its tokenizer without either
    HuggingFaceModel(hf, "tiny").load_model().read_model_config().serialize_to_path(None, str(tmp_path / "s"))
    from tokenizers import Tokenizer as Backend
    expected = Backend.from_file(os.path.join(hf, "tokenizer.json")).encode("hi é").ids
    assert DashInferModel(str(tmp_path / "s"), "tiny").get_tokenizer().encode("hi é") == expected


SERVE_AND_CHAT = """
import sys
import dashinfer_server.service, dashinfer_server.engine, dashinfer_server.__main__, dashinfer_server.startup_log
import dashinfer_server.cli.chat, dashinfer_client.tokenizer
from dashinfer_client.model import DashInferModel
tok = DashInferModel(sys.argv[1], sys.argv[2]).get_tokenizer()
ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=False)
assert tok.decode(ids).endswith("assistant\\n")
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")))
"""


def test_serving_and_chatting_import_neither_torch_nor_transformers():
    model_dir, prefix = default_model.ensure_default_model("bfloat16", progress=False)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", SERVE_AND_CHAT, model_dir, prefix],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "dashinfer_client.tokenizer" in imported and "tokenizers" in imported  # the check sees imports
    assert not [m for m in imported if m.split(".")[0] in ("torch", "transformers")]


def test_text_with_a_lone_surrogate_is_refused_by_name(pair):
    """Python decodes bytes that are not UTF-8 (argv, a terminal) into lone surrogates: the error
    says so instead of the tokenizers library's TypeError about its input types."""
    ours, _ = pair
    with pytest.raises(ValueError, match=r"lone surrogate '\\udce9' at character 3"):
        ours.encode("caf\udce9")
    with pytest.raises(ValueError, match="not valid Unicode"):
        ours("a\ud800b")
