"""Ask the default model (SmolLM2-135M-Instruct) one question and stream its answer.

    python -m dashinfer_client.chat "What is the capital of France?"
    python -m dashinfer_client.chat --dtype float32 --quant int8 --max-new-tokens 64 "Hi!"

The model is fetched and converted on first use (dashinfer_client.default_model). --ranks 0 serves
it in this process (the Engine); N > 0 serves it on N tensor-parallel server ranks through a
ClientEngine. The answer goes to stdout as it is generated; a one-line summary (time to first
token, speeds) goes to stderr.
"""
import argparse
import logging
import sys

import dashinfer_client as allspark
from dashinfer_client import AsStatus, GenerateRequestStatus, default_model
from dashinfer_client.detokenize import IncrementalDecoder

MODEL_NAME = "default"


def open_engine(ranks: int):
    """The engine serving the model: the in-process Engine (ranks 0), else a ClientEngine driving
    `ranks` server ranks. Either offers the same API; nothing else here depends on which."""
    if ranks == 0:
        return allspark.Engine()
    try:
        client_engine = allspark.ClientEngine
    except ImportError as e:
        raise SystemExit(f"chat: --ranks {ranks} needs the ClientEngine, which this build lacks ({e}); "
                         "use --ranks 0") from None
    return client_engine(nodes=ranks)


def summary(stats) -> str:
    prompt, cached, new = stats["context_token_length"], stats["context_cached_length"], \
        stats["generated_token_length"]
    return (f"[{new} tokens; time to first token {stats['time_to_first_token']:.0f} ms "
            f"({prompt} prompt tokens{f', {cached} cached' if cached else ''}, "
            f"{stats['context_tps']:.0f} tok/s); decode {stats['generate_tps']:.1f} tok/s]")


def chat(question, ranks=0, dtype="bfloat16", quant=None, max_new_tokens=256, temperature=0.0,
         seed=None, out=sys.stdout, err=sys.stderr) -> int:
    engine = open_engine(ranks)
    model_dir, prefix = default_model.ensure_default_model(dtype, quant=quant)
    loader = allspark.DashInferModel(model_dir, prefix)
    tokenizer = loader.get_tokenizer()
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    max_length = min(loader.get_model_context_length(), max(2048, len(prompt) + max_new_tokens))

    runtime = (loader.create_reference_runtime_config_builder(MODEL_NAME, allspark.TargetDevice.CPU, [0],
                                                              max_batch=1)
               .max_length(max_length).max_prefill_length(512).build())
    for step, status in (("install_model", lambda: engine.install_model(runtime)),
                         ("start_model", lambda: engine.start_model(MODEL_NAME))):
        if status() != AsStatus.ALLSPARK_SUCCESS:
            print(f"chat: {step} failed", file=err)
            return 1
    try:
        gen = loader.create_reference_generation_config_builder(runtime).update({
            "max_length": len(prompt) + max_new_tokens,
            "do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0,
        })
        if seed is not None:
            gen.seed(seed)
        status, handle, queue = engine.start_request_ids(MODEL_NAME, loader, prompt, gen)
        if status != AsStatus.ALLSPARK_SUCCESS:
            print(f"chat: the request was refused ({status.name})", file=err)
            return 1
        decoder = IncrementalDecoder(tokenizer)
        while (elements := queue.Get()) is not None:
            out.write(decoder.push(elements.ids_from_generate))
            out.flush()
        out.write(decoder.finish() + "\n")
        if queue.GenerateStatus() != GenerateRequestStatus.GenerateFinished:
            print(f"chat: generation interrupted: {queue.error}", file=err)
            return 1
        print(summary(queue.RequestStatInfo()), file=err)
        engine.release_request(MODEL_NAME, handle)
    finally:
        engine.release_model(MODEL_NAME)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashinfer_client.chat", description=__doc__.split("\n")[0])
    parser.add_argument("question")
    parser.add_argument("--ranks", type=int, default=0,
                        help="0: serve in this process (default); N: N tensor-parallel server ranks")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--quant", default="none", choices=("none",) + default_model.QUANT_FORMATS,
                        help="weight-only quantization of the linear layers")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    if args.ranks < 0 or args.max_new_tokens < 1 or args.temperature < 0:
        parser.error("--ranks must be >= 0, --max-new-tokens >= 1 and --temperature >= 0")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    return chat(args.question, args.ranks, args.dtype, None if args.quant == "none" else args.quant,
                args.max_new_tokens, args.temperature, args.seed)


if __name__ == "__main__":
    sys.exit(main())
