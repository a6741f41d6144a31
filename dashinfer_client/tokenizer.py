"""A tokenizer read from a Hugging Face tokenizer directory with `tokenizers` and jinja2 only.

Serving and chatting must not import transformers (and through it torch) just to turn text into
ids: this class reads tokenizer.json, tokenizer_config.json and the chat template(s)
(chat_template.jinja and additional_chat_templates/, the config's "chat_template", or
chat_template.json) and offers the part of transformers' tokenizer API the runtime and its users
call: __call__, encode, decode, batch_decode, apply_chat_template, the special tokens and their ids.
It behaves as transformers 5's generic fast tokenizer (TokenizersBackend / PreTrainedTokenizerFast)
does on the same files; directories whose tokenizer class rebuilds the pipeline in Python (e.g.
LlamaTokenizer) are not its to read: `supports(path)` says which are, and the model handles fall
back to transformers. What encode adds around a text (bos/eos) is tokenizer.json's post-processor,
as in transformers 5, which ignores the config's add_bos_token/add_eos_token when tokenizer.json
exists.
"""
import json
import os
from datetime import datetime

# tokenizer_class values whose behaviour is exactly tokenizer.json plus tokenizer_config.json.
GENERIC_CLASSES = {None, "TokenizersBackend", "PreTrainedTokenizerFast"}
CHAT_TEMPLATE_DIR = "additional_chat_templates"  # transformers' named templates beside chat_template.jinja
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def supports(path) -> bool:
    """True when `path` holds a tokenizer this class reproduces (tokenizer.json, a generic class)."""
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        return False
    return _read_json(os.path.join(path, "tokenizer_config.json")).get("tokenizer_class") in GENERIC_CLASSES


def _read_json(path) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _token_text(value):
    """A special token as the config writes it: a string or a serialized AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def _read_text(path) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _find_chat_template(path, config):
    """The chat template as transformers reads it: chat_template.jinja (named "default") and the named
    ones in additional_chat_templates/, else tokenizer_config.json's (maybe a list of named ones),
    else a processor's chat_template.json (transformers' tokenizer never reads it; vLLM falls back
    to it). Several templates: a dict by name, as transformers holds them."""
    named = {}
    if os.path.isfile(os.path.join(path, "chat_template.jinja")):
        named["default"] = _read_text(os.path.join(path, "chat_template.jinja"))
    extra_dir = os.path.join(path, CHAT_TEMPLATE_DIR)
    if os.path.isdir(extra_dir):
        for name in sorted(os.listdir(extra_dir)):
            if name.endswith(".jinja"):
                named[name[:-len(".jinja")]] = _read_text(os.path.join(extra_dir, name))
    if named:
        return named["default"] if list(named) == ["default"] else named
    template = config.get("chat_template") or _read_json(os.path.join(path, "chat_template.json")).get("chat_template")
    if isinstance(template, list):
        template = {t["name"]: t["template"] for t in template}
    return template


def added_tokens(tokenizer) -> dict:
    """The added tokens of a tokenizer (this module's or a Hugging Face fast one), special or not
    (a chat format's markers), text -> id."""
    return {t.content: i for i, t in tokenizer.backend_tokenizer.get_added_tokens_decoder().items()}


class Tokenizer:
    """Tokenizer(path, padding_side="left"): the tokenizer of a Hugging Face tokenizer directory."""

    def __init__(self, path, padding_side="left"):
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as Backend
        self.name_or_path = str(path)
        self.padding_side = padding_side
        config = _read_json(os.path.join(path, "tokenizer_config.json"))
        self.init_kwargs = config
        self._backend = Backend.from_file(os.path.join(path, "tokenizer.json"))
        listed = set(self._backend.get_vocab(with_added_tokens=True))
        for entry in (config.get("added_tokens_decoder") or {}).values():
            if entry["content"] not in listed:
                add = self._backend.add_special_tokens if entry.get("special") else self._backend.add_tokens
                add([AddedToken(entry["content"], single_word=entry.get("single_word", False),
                                lstrip=entry.get("lstrip", False), rstrip=entry.get("rstrip", False),
                                normalized=entry.get("normalized", False), special=entry.get("special", False))])
        self.special_tokens_map = {k: _token_text(config[k]) for k in SPECIAL_KEYS if config.get(k)}
        for key in SPECIAL_KEYS:
            setattr(self, key, self.special_tokens_map.get(key))
        self.chat_template = _find_chat_template(path, config)
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self._templates = {}  # the model's own templates, compiled once each

    # ---- ids and tokens ------------------------------------------------------------------------

    def __getattr__(self, name):
        # bos_token_id, eos_token_id, pad_token_id...: the id of the matching special token
        if name.endswith("_token_id") and name[:-3] in SPECIAL_KEYS:
            token = self.__dict__.get("special_tokens_map", {}).get(name[:-3])
            return None if token is None else self.convert_tokens_to_ids(token)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @property
    def backend_tokenizer(self):
        """The `tokenizers.Tokenizer` underneath, as transformers' fast tokenizers name it."""
        return self._backend

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._backend.token_to_id(tokens)
        return [self._backend.token_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        return [self._backend.id_to_token(int(i)) for i in ids]

    @property
    def all_special_tokens(self) -> list:
        return list(dict.fromkeys(self.special_tokens_map.values()))

    @property
    def all_special_ids(self) -> list:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=False)

    def __len__(self):
        return self._backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict:
        return self._backend.get_vocab(with_added_tokens=True)

    # ---- text <-> ids --------------------------------------------------------------------------

    def encode(self, text, add_special_tokens=True) -> list:
        # encode_batch lets go of the GIL while it runs and encode does not: a megabyte prompt
        # tokenized in a server's worker thread must not stop its event loop for seconds
        try:
            return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        except TypeError:
            check_text(text)
            raise

    def __call__(self, text, add_special_tokens=True, padding=False, truncation=False, return_tensors=None):
        """{"input_ids", "attention_mask"} of a text, or lists of them for a list of texts."""
        if padding or truncation or return_tensors:
            raise ValueError("this tokenizer returns plain lists: padding, truncation and return_tensors "
                             "are not supported")
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        encoded = self._backend.encode_batch(list(text), add_special_tokens=add_special_tokens)
        return {"input_ids": [e.ids for e in encoded], "attention_mask": [[1] * len(e.ids) for e in encoded]}

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=None) -> str:
        if isinstance(ids, dict):
            ids = ids["input_ids"]
        ids = [int(ids)] if not hasattr(ids, "__len__") else [int(i) for i in ids]
        text = self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
        clean = self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None \
            else clean_up_tokenization_spaces
        # transformers skips the clean-up for BPE (it would strip real spaces before punctuation)
        if clean and type(self._backend.model).__name__ != "BPE":
            for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                                  (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(before, after)
        return text

    def batch_decode(self, sequences, skip_special_tokens=False) -> list:
        return [self.decode(s, skip_special_tokens=skip_special_tokens) for s in sequences]

    # ---- chat ----------------------------------------------------------------------------------

    def apply_chat_template(self, conversation, add_generation_prompt=False, tokenize=True, return_dict=True,
                            chat_template=None, tools=None, documents=None, continue_final_message=False, **kwargs):
        """The model's chat template rendered over `conversation` (a list of {"role", "content"}
        messages); tokenize=True: its ids as {"input_ids", "attention_mask"} (a plain list with
        return_dict=False), special tokens from the text only, as transformers does.
        continue_final_message: the text ends right after the final message's content, left open for
        the model to continue (a prefill), as transformers cuts it; not with add_generation_prompt."""
        if not conversation:
            raise ValueError("cannot apply the chat template to an empty conversation")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible")
        template = self._compiled(chat_template, tools)
        messages = [{k: v for k, v in m.items() if v is not None} for m in conversation]
        if continue_final_message:
            final = messages[-1].get("content")
            if not isinstance(final, str):
                raise ValueError("continue_final_message: the final message has no text content to continue")
            messages[-1]["content"] = final + CONTINUE_TAG
        values = {**self.special_tokens_map, **kwargs}
        text = template.render(messages=messages, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **values)
        if continue_final_message:
            text = _cut_after_final(text, final)
        if not tokenize:
            return text
        out = self(text, add_special_tokens=False)
        return out if return_dict else out["input_ids"]

    def _compiled(self, chat_template=None, tools=None):
        """The template to render, chosen as transformers chooses: among named templates the one
        `chat_template` names, else "tool_use" when tools are given, else "default"."""
        own = self.chat_template
        if isinstance(own, dict) and (chat_template is None or chat_template in own):
            if chat_template is None:
                chat_template = "tool_use" if tools is not None and "tool_use" in own else "default"
            if chat_template not in own:
                raise ValueError(f"the tokenizer in {self.name_or_path} has several chat templates and no "
                                 f"default: name one of {', '.join(sorted(own))}")
            own = own[chat_template]
        elif chat_template is not None:
            return _compile(chat_template)
        if own is None:
            raise ValueError(f"the tokenizer in {self.name_or_path} has no chat template")
        if own not in self._templates:
            self._templates[own] = _compile(own)
        return self._templates[own]


# transformers' mark after the final message's content: where the rendered chat is cut to leave it open
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _cut_after_final(text, final: str) -> str:
    """The rendered chat cut right before CONTINUE_TAG; where the template trimmed the space after
    it, the message's trailing spaces go too (transformers' render_jinja_template)."""
    at = text.rfind(CONTINUE_TAG.strip())
    if at < 0 or final.strip() not in text:
        raise ValueError("continue_final_message: the chat template does not render the final message as it is")
    return text[:at] if text[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG else text[:at].rstrip()


def _compile(source):
    """A chat template compiled in a sandbox with the helpers Hugging Face templates use."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """{% generation %}...{% endgeneration %} (marks assistant text for training): the body as is."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters, which a prompt must keep
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def check_text(text) -> None:
    """ValueError when a str holds a lone UTF-16 surrogate: not Unicode text (Python decodes
    undecodable bytes of argv or a terminal into them), which no tokenizer takes."""
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"the text is not valid Unicode: a lone surrogate {text[e.start]!r} at character "
                             f"{e.start} (bytes that were not UTF-8?)") from None
