"""DashInfer 1.3's EngineHelper: a JSON config in, a served model and a request loop out.

    helper = EngineHelper(config)              # ConfigManager.create_config(config)
    helper.init_tokenizer(hf_dir)
    helper.convert_model(hf_dir)               # torch model -> {model_path}/{name}.dimodel/.ditensors
    helper.init_engine()                       # build_model_from_config_struct + start_model
    requests = helper.create_request(["text", ...], [gen_cfg, ...])
    helper.process_one_request(requests[0])    # or: for text in helper.process_one_request_stream(r)
    helper.print_profiling_data(requests, total_seconds); helper.uninit_engine()

Everything goes through the public API of Engine (ClientEngine when the config asks for several
NUMA nodes or multinode_mode): no second engine. Only convert_model needs torch and transformers;
a helper over a model already converted serves without them (check_model_exist(), then init_engine()).
"""
import dataclasses
import gc
import json
import os
import time
from typing import Any, List, Optional

import numpy as np

from ..as_model_config import AsModelConfig
from ..frontend import OutputProcessor, Prompts, new_engine
from ..quantization import QuantizeConfig
from ..refusals import Refused
from ..types import AsStatus, GenerateRequestStatus
from .config_manager import ConfigManager
from .profiling import ProfilingData

TORCH_DTYPES = ("float32", "float16", "bfloat16")


@dataclasses.dataclass
class Request:
    """One prompt and, once processed, its answer and timings (DashInfer 1.3's fields).
    torch_input holds the prompt ids as a numpy int64 [1, n] array (no torch needed to serve)."""
    id: int = -1
    model_info: Optional[str] = None
    torch_input: Optional[dict] = None
    in_text: Optional[str] = None
    in_tokens: Optional[List[int]] = None
    in_tokens_len: Optional[int] = None
    out_text: Optional[str] = None
    out_tokens: Optional[List[int]] = None
    out_tokens_len: Optional[int] = None
    status: Optional[int] = None
    gen_cfg: Optional[dict] = None
    start_timestamp: Optional[str] = None
    end_timestamp: Optional[str] = None
    context_time: float = 0
    generate_time: float = 0
    handle: Any = dataclasses.field(default=None)
    queue: Any = dataclasses.field(default=None)


class EngineHelper:
    Request = Request
    ProfilingData = ProfilingData

    def __init__(self, user_config):
        config = ConfigManager.create_config(user_config)
        self.config = config
        self.model_type = config["model_type"]
        self.model_path = os.path.expanduser(config["model_path"])
        self.data_type = config["data_type"]
        self.device_type = config["device_type"]
        self.device_ids = list(config["device_ids"])
        self.multinode_mode = bool(config["multinode_mode"]) or len(self.device_ids) > 1
        self.convert_config = config["convert_config"]
        self.quant_config = None
        suffix = ""
        if self.convert_config["do_dynamic_quantize_convert"]:
            q = config["quantization_config"]
            self.quant_config = QuantizeConfig(activation_type=q["activation_type"], weight_type=q["weight_type"],
                                               extra_option={"SubChannel": q["SubChannel"],
                                                             "GroupSize": q["GroupSize"]})
            suffix = "_a16w4" if self.quant_config.weight_format == "uint4" else "_a16w8"
        # DashInfer 1.3's file name: the settings the files were converted with are part of it.
        self.model_name = (f"{config['model_name']}_{self.device_type.lower()}"
                           f"_{'multi' if self.multinode_mode else 'single'}_{self.data_type}{suffix}")
        self.default_gen_cfg = config["generation_config"]
        self.engine_config = config["engine_config"]
        self.profiling_data = ProfilingData(self.engine_config["engine_max_batch"])
        self.tokenizer = None
        self.torch_model = None
        self.torch_model_module = None
        self.model_config = None
        self.verbose = False
        self.engine = new_engine(None if self.multinode_mode else 1)

    # ---- tokenizer and conversion ---------------------------------------------------------------------

    def init_tokenizer(self, hf_model_path):
        """The model's tokenizer (padding on the left): tokenizers + jinja2 when they reproduce it,
        else transformers' AutoTokenizer. An eos_token_id of -1 (or none) in the generation config
        becomes the tokenizer's."""
        from ..model.hf import HuggingFaceModel
        self.tokenizer = HuggingFaceModel(hf_model_path, "tokenizer").init_tokenizer(padding_side="left").tokenizer
        if self.tokenizer.eos_token_id is None:
            self.tokenizer.eos_token_id = self.default_gen_cfg["eos_token_id"]
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token_id = self.tokenizer.eos_token_id
        if self.default_gen_cfg.get("eos_token_id") in (-1, [], None):
            self.default_gen_cfg["eos_token_id"] = self.tokenizer.eos_token_id

    def check_model_exist(self):
        for path in self._model_files():
            if not os.path.exists(path):
                print(f"\nNo such file or directory: {path}\n")
                return False
        return True

    def convert_model(self, hf_model_path):
        """Load the Hugging Face model with transformers (in data_type) and write it with
        engine.serialize_model_from_torch into model_path."""
        self._init_torch_model(hf_model_path)
        print("trans model from huggingface model:", hf_model_path)
        print("Dashinfer model will save to ", self.model_path)
        begin = time.time()
        self.engine.serialize_model_from_torch(
            model_name=self.model_name, model_type=self.model_type, torch_model=self.torch_model_module,
            multinode_mode=self.multinode_mode, model_config=self.model_config, data_type=self.data_type,
            do_dynamic_quantize_convert=self.convert_config["do_dynamic_quantize_convert"],
            quant_config=self.quant_config, use_dynamic_ntk=self.model_config["use_dynamic_ntk"],
            use_logn_attn=self.model_config["use_logn_attn"], save_dir=self.model_path)
        print(f"convert model from HF finished, build time is {time.time() - begin} seconds")
        self._uninit_torch_model()

    def _init_torch_model(self, hf_model_path):
        import torch
        from transformers import AutoModelForCausalLM
        if self.data_type not in TORCH_DTYPES:
            raise ValueError(f"unsupported data type: {self.data_type}")
        model = AutoModelForCausalLM.from_pretrained(hf_model_path, dtype=getattr(torch, self.data_type))
        self.torch_model = model.eval()
        self.model_config = dict(model.config.__dict__)
        self.model_config.setdefault("use_dynamic_ntk", False)
        self.model_config.setdefault("use_logn_attn", False)
        self.model_config["size_per_head"] = self.model_config["hidden_size"] // self.model_config["num_attention_heads"]
        self.torch_model_module = model.state_dict()

    def _uninit_torch_model(self):
        self.torch_model = None
        self.torch_model_module = None
        gc.collect()

    # ---- the engine -------------------------------------------------------------------------------------

    def init_engine(self):
        """Install the converted model (DashInfer 1.3's AsModelConfig) and start it."""
        begin = time.time()
        if not self.check_model_exist():
            raise FileNotFoundError(f"model {self.model_name} is not converted in {self.model_path}: "
                                    "call convert_model() first")
        graph, params = self._model_files()
        cfg = AsModelConfig(model_name=self.model_name, model_path=graph, weights_path=params,
                            engine_max_length=self.engine_config["engine_max_length"],
                            engine_max_batch=self.engine_config["engine_max_batch"])
        cfg.compute_unit = f"{self.device_type}:{','.join(map(str, self.device_ids))}"
        cfg.num_threads = max(0, int(self.engine_config["num_threads"]))  # 0: every core of the node
        cfg.matmul_precision = self.engine_config["matmul_precision"]
        try:
            self.engine.serve_model(cfg)
        except Refused as e:
            raise RuntimeError(f"init_engine failed: {e.status.name}: {e}") from None
        print(f"build model over, build time is {time.time() - begin}")

    def uninit_engine(self):
        if self.engine_config["do_profiling"]:
            profile = getattr(self.engine, "get_op_profiling_info", None)
            info = profile(self.model_name) if profile else "op profiling is not available on this engine"
            print(f"\n***************\n* profile_info\n***************\n{info}\n")
        for call in (self.engine.stop_model, self.engine.release_model):
            status = call(self.model_name)
            if status != AsStatus.ALLSPARK_SUCCESS:
                raise RuntimeError(f"{call.__name__} failed: {status.name}: {self.engine.last_error}")

    def _model_files(self):
        return tuple(os.path.join(self.model_path, self.model_name + s) for s in (".dimodel", ".ditensors"))

    # ---- requests ---------------------------------------------------------------------------------------

    def create_request(self, prompt: list, gen_cfg=None):
        """One Request per prompt (texts, or lists of token ids), each with its generation config
        (gen_cfg: a list as long as prompt; default: default_gen_cfg)."""
        if not prompt:
            raise ValueError("No valid input")
        if isinstance(prompt[0], list):
            is_encoded = True
        elif isinstance(prompt[0], str):
            is_encoded = False
        else:
            raise ValueError("Invalid inputs")
        if gen_cfg is not None and len(gen_cfg) != len(prompt):
            raise ValueError("len(gen_cfg) does not match len(prompt)")
        requests = []
        for i, p in enumerate(prompt):
            if is_encoded:
                ids, text = [int(t) for t in p], self.tokenizer.decode(p, skip_special_tokens=False)
            else:
                ids, text = Prompts(self.tokenizer).text_ids(p), p
            requests.append(Request(
                id=i, model_info=self.model_name, in_text=text, in_tokens=ids, in_tokens_len=len(ids),
                torch_input={"input_ids": np.asarray([ids], dtype=np.int64)},
                gen_cfg=gen_cfg[i] if gen_cfg is not None else self.default_gen_cfg))
        return requests

    def process_one_request(self, request):
        for _ in self.process_one_request_impl(request, stream_mode=False):
            pass

    def process_one_request_stream(self, request):
        """Yields the answer's text so far after each batch of new tokens."""
        yield from self.process_one_request_impl(request, stream_mode=True)

    def process_one_request_impl(self, request, stream_mode=False):
        if self.verbose:
            print(f"### generation_config: {request.gen_cfg}")
        request.start_timestamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        start = time.time()
        try:
            handle, queue = self.engine.submit(self.model_name, request.in_tokens, dict(request.gen_cfg))
        except Refused as e:
            request.status = int(e.status)
            raise RuntimeError(f"request {request.id} refused: {e.status.name}: {e}") from None
        request.status = int(AsStatus.ALLSPARK_SUCCESS)
        request.handle, request.queue = handle, queue
        output, output_ids, texts, first_token_at = OutputProcessor(self.tokenizer), [], [], None
        try:
            while (elements := queue.Get()) is not None:  # None: ended and everything delivered
                new_ids = elements.ids_from_generate
                if not new_ids:
                    continue
                if first_token_at is None:
                    first_token_at = time.time()
                    request.context_time = first_token_at - start
                output_ids.extend(new_ids)
                texts.append(output.push(elements).text)
                request.out_tokens, request.out_tokens_len = output_ids, len(output_ids)
                request.out_text = "".join(texts)
                if stream_mode:
                    yield request.out_text
            tail = output.finish(queue.RequestStatInfo()["finish_reason"]).text  # a character held back
            if tail:
                request.out_text = "".join(texts) + tail
                if stream_mode:
                    yield request.out_text
            final = queue.GenerateStatus()
            request.status = int(final)
            if final == GenerateRequestStatus.GenerateFinished:
                request.generate_time = time.time() - (first_token_at or start)
                request.end_timestamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
            else:
                print(f"[Error] Request interrupted! {queue.error or ''}")
        finally:
            self.engine.release_request(self.model_name, handle)

    # ---- reports ----------------------------------------------------------------------------------------

    def convert_request_to_jsonstr(self, request):
        """The request's fields as JSON; what JSON cannot hold (handle, queue, arrays) as null."""
        return json.dumps(request.__dict__, ensure_ascii=False, default=lambda value: None)

    def print_inference_result(self, request):
        if self.verbose:
            print("***********************************\n"
                  f"* Answer (dashinfer) for Request {request.id}\n"
                  "***********************************\n"
                  f"** context_time: {request.context_time} s, generate_time: {request.generate_time} s\n\n"
                  f"** encoded input, len: {request.in_tokens_len} **\n{request.in_tokens}\n\n"
                  f"** encoded output, len: {request.out_tokens_len} **\n{request.out_tokens}\n\n"
                  f"** text input **\n{request.in_text}\n\n"
                  f"** text output **\n{request.out_text}\n\n")

    def print_inference_result_all(self, request_list):
        for request in request_list:
            self.print_inference_result(request)

    def print_profiling_data(self, request_list, total_time=0):
        self.profiling_data.reset(self.engine_config["engine_max_batch"])
        for r in request_list:
            self.profiling_data.update(r.in_tokens_len, r.out_tokens_len, r.context_time, r.generate_time)
        self.profiling_data.update_df(total_time)
        self.profiling_data.show()

    def fetch_config(self):
        return self.config
