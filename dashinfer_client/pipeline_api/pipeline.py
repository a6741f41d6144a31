"""pipeline(model): LMDeploy's offline inference API over this runtime's DashInfer API.

    with pipeline(None, backend_config=TurbomindEngineConfig(tp=2)) as pipe:
        print(pipe(["Hi, please introduce yourself", "Shanghai is"]))

A Pipeline owns one engine: the in-process Engine for tp=1, a ClientEngine over tp server ranks
(one per NUMA node) for tp > 1. Every prompt of a call is submitted before any is read, so they share
the engine's continuous batching; nothing here schedules, samples or tokenizes differently from
the engine's own API.
"""
import logging
import math
import os
import queue as queue_module
import threading

from .. import memory
from ..config import ASGenerationConfigBuilder
from ..frontend import Prompts, start_engine
from ..model_cache import model_format, resolve_model
from ..refusals import Refused
from ..types import TargetDevice
from ..frontend.messages import chat_messages
from .chat_template import BUILTIN, ChatOptions, ChatTemplateConfig, prompt_text
from .engine_config import engine_settings
from .generation import GenerationConfig, encode_words, request_options
from .response import Answer, too_long
from .running import CLOSED, RunningRequests

MODEL_NAME = "pipeline"
# session_len None: the model's context, at most this (the KV pool is reserved for max_batch_size
# requests of session_len tokens, and a long pool makes start_model slower).
DEFAULT_SESSION_LEN = 4096
LOG_LEVELS = ("CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG", "NOTSET")


def pipeline(model_path=None, model_name=None, backend_config=None, chat_template_config=None,
             log_level="ERROR", **kwargs) -> "Pipeline":
    """A Pipeline serving model_path (see Pipeline); kwargs set fields of backend_config."""
    return Pipeline(model_path, model_name, backend_config, chat_template_config, log_level, **kwargs)


def _kv_budget_mb(settings, loader, session_len):
    """kv_cache_memory_mb: 0 (room for max_batch_size x session_len, the engine's default) when that
    fits in cache_max_entry_count of the free memory, else that fraction of it."""
    c = loader.config
    upper_bytes_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4  # fp32 K+V
    need_mb = settings.max_batch_size * session_len * upper_bytes_per_token / 2**20
    budget_mb = int(settings.cache_max_entry_count * memory.available()[0] / 2**20)
    return 0 if need_mb <= budget_mb else budget_mb


def _check_format(model_path, wanted):
    """Refuse a model_format that model_path's model is not, before anything is converted."""
    kind = model_format(model_path)
    if wanted is not None and kind is not None and kind != wanted:
        name = "the default model" if model_path is None else f"model_path {os.fspath(model_path)}"
        raise ValueError(f"model_format={wanted!r} but {name} is a {kind} model")


class Pipeline:
    """model_path: a Hugging Face directory, a GGUF file, a serialized model (directory or
    {dir}/{prefix}), or None / the default model's name (dashinfer_client.model_cache.resolve_model).
    model_name: a label; a built-in chat template's name ('chatml', 'qwen', 'llama3') selects it.
    backend_config: TurbomindEngineConfig, PytorchEngineConfig or CpuEngineConfig (engine_config.py).
    chat_template_config: ChatTemplateConfig; None = the model's own chat template."""

    def __init__(self, model_path=None, model_name=None, backend_config=None, chat_template_config=None,
                 log_level="ERROR", **kwargs):
        from ..model.serialized import DashInferModel
        if not isinstance(log_level, str) or log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
        for name in ("dashinfer_client", "dashinfer_server"):
            logging.getLogger(name).setLevel(log_level.upper())
        if model_name is not None and not isinstance(model_name, str):
            raise TypeError(f"model_name must be a str or None, got {type(model_name).__name__}")
        if chat_template_config is None:
            chat_template_config = ChatTemplateConfig(model_name if model_name in BUILTIN else None)
        if not isinstance(chat_template_config, ChatTemplateConfig):
            raise TypeError(f"chat_template_config must be a ChatTemplateConfig or None, "
                            f"got {type(chat_template_config).__name__}")
        self.chat_template = chat_template_config
        self.settings = s = engine_settings(backend_config, kwargs)
        _check_format(model_path, s.model_format)
        model_dir, prefix = resolve_model(model_path, dtype=s.dtype, quant=s.weight_quant)
        self.model_name = model_name or prefix
        self.loader = DashInferModel(model_dir, prefix)
        self.tokenizer = self.loader.get_tokenizer()
        self.session_len = s.session_len or min(DEFAULT_SESSION_LEN, self.loader.get_model_context_length())
        self.prompts = Prompts(self.tokenizer)
        self.eos_ids = self.loader.eos_token_ids()
        self._template_stops = encode_words(self.prompts, self.chat_template.template_stop_words(), ())
        self._requests = RunningRequests(self._open_engine(), MODEL_NAME)

    def _open_engine(self):
        s = self.settings
        runtime = (self.loader.create_reference_runtime_config_builder(
                       MODEL_NAME, TargetDevice.CPU, [0], max_batch=s.max_batch_size)
                   .max_length(self.session_len).kv_cache_mode(s.kv_cache_mode)
                   .kv_cache_span_size(s.block_size).prefill_cache(s.enable_prefix_caching)
                   .max_prefill_length(s.max_prefill_token_num).thread_num(s.threads_per_rank or 0)
                   .kv_cache_memory_mb(_kv_budget_mb(s, self.loader, self.session_len)).build())
        try:
            return start_engine(runtime, s.tp, s.threads_per_rank)
        except Refused as e:
            raise RuntimeError(f"pipeline: the engine refused the model ({e.status.name}): {e}") from None

    # ---- prompts -------------------------------------------------------------------------------

    def _prompt_list(self, prompts):
        """(list of str | conversation, whether one prompt was given)."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], dict)):
            return [prompts], True
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a str, a list of str, a conversation (list of {{'role', "
                            f"'content'}} dicts) or a list of them, got {type(prompts).__name__}")
        if not prompts:
            raise ValueError("prompts is an empty list: give at least one prompt")
        for i, p in enumerate(prompts):
            if not isinstance(p, (str, list)):
                raise TypeError(f"prompts[{i}] must be a str or a conversation (list of dicts), "
                                f"got {type(p).__name__}")
        return list(prompts), False

    def _input(self, prompt, i, do_preprocess, chat):
        """(ids, the prompt's text through the chat template or None) of one prompt."""
        if isinstance(prompt, str):
            if not do_preprocess:
                if chat.functions or chat.template_kwargs:
                    raise ValueError("tools and chat template options need do_preprocess=True (the chat template)")
                return self.prompts.text_ids(prompt), None
            prompt = [{"role": "user", "content": prompt}]
        elif not do_preprocess:
            raise ValueError(f"prompts[{i}]: a conversation needs do_preprocess=True (the chat template)")
        messages = chat_messages(prompt, f"prompts[{i}]")
        text = prompt_text(self.prompts, messages, self.chat_template, chat.functions, chat.template_kwargs)
        return self.prompts.text_ids(text, special=False), text

    def _gen_configs(self, gen_config, n, deprecated):
        """One GenerationConfig per prompt (gen_config: None, one, or a list of n, as LMDeploy)."""
        configs = gen_config if isinstance(gen_config, list) else [gen_config] * n
        if len(configs) != n:
            raise ValueError(f"gen_config is a list of {len(configs)} GenerationConfig for {n} prompts")
        out = []
        for gen in configs:
            gen = gen if gen is not None else GenerationConfig()
            if not isinstance(gen, GenerationConfig):
                raise TypeError(f"gen_config must be a GenerationConfig, a list of them, or None, "
                                f"got {type(gen).__name__}")
            out.append(gen.with_deprecated(deprecated))
        return out

    def _plan(self, prompts, gen_config, do_preprocess, chat, deprecated):
        """Everything checked before anything is submitted -> (one prompt?, [(ids, options | None
        when the prompt fills the session, Answer)])."""
        if self._requests.closed:
            raise RuntimeError(CLOSED)
        prompt_list, one = self._prompt_list(prompts)
        plan = []
        for i, (prompt, gen) in enumerate(zip(prompt_list, self._gen_configs(gen_config, len(prompt_list),
                                                                             deprecated))):
            ids, text = self._input(prompt, i, do_preprocess, chat)
            if not ids:
                raise ValueError(f"prompts[{i}] is empty after tokenization")
            stops = encode_words(self.prompts, gen.stop_words, gen.stop_token_ids) + self._template_stops
            options = None
            if len(ids) < self.session_len:
                options = request_options(gen, len(ids), self.session_len, stops,
                                          encode_words(self.prompts, gen.bad_words, gen.bad_token_ids))
                ASGenerationConfigBuilder().update(options)  # bad values raise here, before any submission
            terminators = ([] if gen.ignore_eos else [[e] for e in self.eos_ids]) + stops
            chatting = text is not None  # the parsers read answers to the chat template's prompts
            reasoning = self.prompts.reasoning_parser(text) if chatting else None
            tools = self.prompts.tool_parser(chat.functions) if chatting else None
            plan.append((ids, options, Answer(i, len(ids), self.tokenizer, gen.skip_special_tokens, terminators,
                                              gen.logprobs is not None, reasoning, tools)))
        return one, plan

    def _submit(self, plan):
        """Start every request -> [(Answer, handle, queue) | Response of a too long prompt]."""
        started = []
        try:
            for i, (ids, options, answer) in enumerate(plan):
                if options is None:
                    started.append(too_long(i, len(ids)))
                    continue
                builder = ASGenerationConfigBuilder(eos_token_id=self.eos_ids).update(options)
                try:
                    handle, queue = self._requests.submit(ids, builder)
                except Refused as e:
                    raise RuntimeError(f"pipeline: prompts[{i}] was refused ({e.status.name}): {e}") from None
                started.append((answer, handle, queue))
        except BaseException:
            self._end(started)
            raise
        return started

    def _end(self, started):
        self._requests.end([item[1] for item in started if isinstance(item, tuple)])

    # ---- the API -------------------------------------------------------------------------------

    def __call__(self, prompts, gen_config=None, do_preprocess=True, tools=None, chat_template_kwargs=None,
                 enable_thinking=None, reasoning_effort=None, **deprecated):
        """One Response for one prompt, a list in input order for several. gen_config: one
        GenerationConfig for all prompts or a list of one per prompt. As LMDeploy's: tools (OpenAI's
        function tools) and chat_template_kwargs go to the model's chat template, enable_thinking
        and reasoning_effort into chat_template_kwargs; see ChatOptions."""
        return self.infer(prompts, gen_config, do_preprocess, tools, chat_template_kwargs, enable_thinking,
                          reasoning_effort, **deprecated)

    def infer(self, prompts, gen_config=None, do_preprocess=True, tools=None, chat_template_kwargs=None,
              enable_thinking=None, reasoning_effort=None, **deprecated):
        chat = ChatOptions.of(tools, chat_template_kwargs, enable_thinking, reasoning_effort)
        one, plan = self._plan(prompts, gen_config, do_preprocess, chat, deprecated)
        started = self._submit(plan)
        out = []
        try:
            for item in started:
                if not isinstance(item, tuple):
                    out.append(item)
                    continue
                answer, handle, queue = item
                # Wait without waking up at every token (that would take the GIL from an in-process
                # engine 32 times a step), then take everything at once.
                self._requests.wait(handle)
                while (elements := queue.Get()) is not None:
                    answer.add(elements)
                out.append(answer.response(queue.RequestStatInfo()["finish_reason"]))
        finally:
            self._end(started)
        return out[0] if one else out

    def stream_infer(self, prompts, gen_config=None, do_preprocess=True, tools=None, chat_template_kwargs=None,
                     enable_thinking=None, reasoning_effort=None, **deprecated):
        """A generator of Response pieces as tokens come, interleaved across the prompts; the last
        piece of each prompt carries its finish_reason. Closing it early stops the requests."""
        chat = ChatOptions.of(tools, chat_template_kwargs, enable_thinking, reasoning_effort)
        return self._stream(self._plan(prompts, gen_config, do_preprocess, chat, deprecated)[1])

    def _stream(self, plan):
        started = self._submit(plan)
        arrivals = queue_module.SimpleQueue()  # (index, GeneratedElements | None at the end)
        readers = []
        for item in started:
            if not isinstance(item, tuple):
                yield item
                continue
            answer, _, queue = item
            reader = threading.Thread(target=_read, args=(answer.session_id, queue, arrivals), daemon=True,
                                      name=f"pipeline-stream-{answer.session_id}")
            reader.start()
            readers.append(reader)
        answers = {item[0].session_id: item for item in started if isinstance(item, tuple)}
        try:
            for _ in range(len(answers)):
                while True:
                    i, elements = arrivals.get()
                    answer, _, queue = answers[i]
                    if elements is None:
                        yield answer.end(queue.RequestStatInfo()["finish_reason"])
                        break
                    piece = answer.add(elements)
                    if piece is not None:
                        yield piece
        finally:
            self._end(started)
            for reader in readers:
                reader.join()

    def get_ppl(self, input_ids) -> list:
        """LMDeploy's: per sequence of token ids (one list of ids, or a list of them), the mean
        cross-entropy of its tokens after the first given those before them (the log of its
        perplexity), from the engine's prompt logprobs. Sequences run together, as a call's prompts."""
        if self._requests.closed:
            raise RuntimeError(CLOSED)
        if not isinstance(input_ids, list) or not input_ids:
            raise TypeError("input_ids must be a list of token ids or a non-empty list of such lists")
        sequences = [input_ids] if isinstance(input_ids[0], int) else input_ids
        for i, ids in enumerate(sequences):
            if not isinstance(ids, list) or len(ids) < 2:
                raise ValueError(f"input_ids[{i}] must be a list of at least 2 token ids (the first is not scored)")
        started = []
        try:
            for i, ids in enumerate(sequences):
                builder = ASGenerationConfigBuilder(eos_token_id=self.eos_ids).update(
                    {"max_length": len(ids) + 1, "do_sample": False, "top_k": 0, "prompt_logprobs": 0})
                try:
                    started.append(self._requests.submit(ids, builder))
                except Refused as e:
                    raise RuntimeError(f"pipeline: input_ids[{i}] was refused ({e.status.name}): {e}") from None
            losses = []
            for handle, queue in started:
                self._requests.wait(handle)
                scored = [lp for elements in iter(queue.Get, None) for lp in elements.prompt_token_logprobs_list]
                if len(scored) != queue.RequestStatInfo()["context_token_length"] - 1:
                    raise RuntimeError(f"pipeline: get_ppl's request ended without its logprobs: {queue.error}")
                losses.append(-math.fsum(scored) / len(scored))
        finally:
            self._requests.end([handle for handle, _ in started])
        return losses

    @property
    def engine(self):
        """The engine serving the model (DashInfer's API); None once closed."""
        return self._requests.engine

    def close(self):
        """Release the model; a ClientEngine's ranks are stopped (sockets and shared memory removed).
        Requests still running, from any thread, are stopped (finish_reason 'abort')."""
        engine = self._requests.close()
        if engine is None:
            return
        engine.release_model(MODEL_NAME)
        if self.settings.tp > 1:
            engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"Pipeline(model={self.model_name!r}, tp={self.settings.tp}, session_len={self.session_len}, "
                f"max_batch_size={self.settings.max_batch_size})")


def _read(index, queue, arrivals):
    """A stream's reader thread: every GeneratedElements of one request, then None."""
    while (elements := queue.Get()) is not None:
        arrivals.put((index, elements))
    arrivals.put((index, None))
