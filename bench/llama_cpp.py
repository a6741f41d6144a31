"""llama.cpp beside this engine on the same random weights, in one run: issue 21's comparison.

    PYTHONPATH=. python bench/llama_cpp.py --model DIR --prepare-only    # build, convert (once)
    PYTHONPATH=. python bench/llama_cpp.py --model DIR [--rounds 2] [--threads 2]

DIR is a Hugging Face directory of a Qwen2/Qwen3 (dense or MoE) or Llama model, e.g. one written by
bench/make_model.py. What it does, all cached under --cache (~/.cache/dashinfer-py/llama.cpp-0.3.36):
1. llama.cpp's source, as PyPI serves it: the sdist of llama-cpp-python 0.3.36 (`pip download
   --no-deps --no-binary llama-cpp-python`: its build tools as wheels; or --sdist FILE) holds it under vendor/llama.cpp. llama-bench and
   llama-quantize are built with cmake (Release, CPU only, GGML_NATIVE, `nice -n 10`, -j 2); cmake
   must be on PATH (`pip install cmake` gives one).
2. The model converted by llama.cpp's own convert_hf_to_gguf.py to bf16, then llama-quantize to
   Q4_0 (its default mix: the output head in Q6_K). The converter wants a tokenizer beside the
   weights and recognizes it by the hash of its ids on a fixed text (get_vocab_base_pre);
   make_model.py writes none. The real tokenizer of the model's family comes from the vocab-only
   GGUFs llama.cpp ships for its tokenizer tests (models/ggml-vocab-qwen2.gguf, ...), rebuilt as
   tokenizer.json by dashinfer_client/model/gguf_tokenizer.py into a directory of links to the
   model's files (the model's own directory is left as it is). Speed does not depend on it:
   llama-bench and bench/engine.py both feed token ids.
3. --rounds rounds, in the order ABBA...: `bench/engine.py --model DIR --quant uint4 --workloads
   decode1,prefill512` (A) and `llama-bench -p 512 -n 128` (B), each with --threads threads. One JSON
   line per figure, then the medians, ours / theirs, and each side's fraction of the same limits:
   prefill against engine.py's bound (bench/machine.py's bf16 peak over the prompt's flops);
   decode against the read bandwidth engine.py measured around its run, over the bytes a token
   reads in each side's own weights (ours: engine.py's decode bound; theirs: the Q4_0 file's
   tensors, the token embedding left out, the experts a token chooses counted, as bench/bounds.py
   counts ours); `llama_over_our_bound` is theirs over our decode bound.
The workloads differ a little: llama-bench's tg128 decodes from an empty context, decode1 after
a 32-token prompt; both time 128 tokens (decode1 127 steps after the first token). Run the
measuring part alone on the machine: figures taken while anything else runs are noise (each
engine.py line carries its host fields; load_avg_1min is printed beside llama-bench's).
llama.cpp's threads spin at each step's barriers, so a loaded host hurts it more than this engine:
at load 6-8 (2 cpus) its tg128 on 4 layers of Qwen3-30B-A3B fell to 0.09 of its bound.
"""
import argparse
import glob
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tarfile
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDIST = "llama-cpp-python==0.3.36"
SDIST_TREE = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
TOOLS = ("llama-bench", "llama-quantize")
# the vocab-only GGUF in llama.cpp's models/ holding each model_type's real tokenizer
VOCABS = {"qwen2": "qwen2", "qwen3": "qwen2", "qwen2_moe": "qwen2", "qwen3_moe": "qwen2", "llama": "llama-bpe"}
MODEL_FILES = ("generation_config.json", "model.safetensors.index.json", "*.safetensors")
# llama-bench's tests (n_prompt, n_gen) as our workloads: pp512 and tg128
LLAMA_TESTS = {(512, 0): "prefill512", (0, 128): "decode1"}
WORKLOADS = tuple(LLAMA_TESTS.values())


def fetch_source(cache: str, sdist: str | None) -> str:
    """llama.cpp's source tree under cache (unpacked from the sdist once); its path."""
    src = os.path.join(cache, SDIST_TREE)
    if os.path.isfile(os.path.join(src, "CMakeLists.txt")):
        return src
    if sdist is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                        SDIST, "-d", cache], check=True)
        sdist = os.path.join(cache, SDIST.replace("-", "_").replace("==", "-") + ".tar.gz")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(SDIST_TREE)]
        if not members:
            raise SystemExit(f"{sdist}: no {SDIST_TREE} inside (not {SDIST}'s sdist)")
        tar.extractall(cache, members, filter="data")
    return src


def cmake_commands(src: str, build: str) -> list:
    """Configure and build llama-bench and llama-quantize: CPU only, tuned for this CPU, static."""
    configure = ["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
                 "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_OPENSSL=OFF"]
    return [["nice", "-n", "10", *configure],
            ["nice", "-n", "10", "cmake", "--build", build, "--config", "Release", "-j", "2",
             "--target", *TOOLS]]


def build_tools(cache: str, src: str) -> dict:
    """{tool: path} of the built tools, built if any is missing."""
    build = os.path.join(cache, "build")
    paths = {t: os.path.join(build, "bin", t) for t in TOOLS}
    if not all(os.access(p, os.X_OK) for p in paths.values()):
        for cmd in cmake_commands(src, build):
            subprocess.run(cmd, check=True)
    return paths


def vocab_gguf(src: str, model_dir: str) -> str:
    """The vocab-only GGUF in llama.cpp's models/ that holds model_dir's family's tokenizer."""
    with open(os.path.join(model_dir, "config.json")) as f:
        model_type = json.load(f).get("model_type")
    if model_type not in VOCABS:
        raise SystemExit(f"{model_dir}: no tokenizer for model_type {model_type!r} here (known: {', '.join(VOCABS)})")
    return os.path.join(src, "models", f"ggml-vocab-{VOCABS[model_type]}.gguf")


def stage_model(model_dir: str, vocab: str, out_dir: str) -> str:
    """out_dir: what convert_hf_to_gguf.py reads: links to model_dir's weights, its config.json
    with `architectures` named (make_model.py's has only model_type; the class is the one this
    runtime's loader infers), and the tokenizer of the GGUF `vocab` as tokenizer.json."""
    import gguf
    from dashinfer_client.model.families import family_for_hf
    from dashinfer_client.model.gguf_tokenizer import write_tokenizer_dir
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    config["architectures"] = [family_for_hf(config)[1]]
    os.makedirs(out_dir, exist_ok=True)
    for pattern in MODEL_FILES:
        for path in glob.glob(os.path.join(os.path.abspath(model_dir), pattern)):
            link = os.path.join(out_dir, os.path.basename(path))
            if not os.path.lexists(link):
                os.symlink(path, link)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    write_tokenizer_dir(gguf.GGUFReader(vocab), out_dir)
    return out_dir


def convert_command(src: str, staged: str, bf16: str) -> list:
    return [sys.executable, os.path.join(src, "convert_hf_to_gguf.py"), staged, "--outfile", bf16, "--outtype", "bf16"]


def quantize_command(tools: dict, bf16: str, q4: str) -> list:
    return [tools["llama-quantize"], bf16, q4, "Q4_0"]


def prepare(model_dir: str, cache: str, sdist: str | None) -> tuple:
    """(tools, the Q4_0 GGUF of model_dir): built and converted once. Each file is written under
    a .part name and renamed when whole, so an interrupted run starts that step again."""
    os.makedirs(cache, exist_ok=True)
    src = fetch_source(cache, sdist)
    path = os.path.abspath(model_dir)
    work = os.path.join(cache, "models", os.path.basename(path) + "-" + hashlib.sha1(path.encode()).hexdigest()[:8])
    q4, bf16 = os.path.join(work, "model-Q4_0.gguf"), os.path.join(work, "model-bf16.gguf")
    if not os.path.isfile(q4) and not os.path.isfile(bf16):
        staged = stage_model(path, vocab_gguf(src, path), os.path.join(work, "hf"))
        subprocess.run(convert_command(src, staged, bf16 + ".part"), check=True)
        os.replace(bf16 + ".part", bf16)
    tools = build_tools(cache, src)
    if not os.path.isfile(q4):
        subprocess.run(quantize_command(tools, bf16, q4 + ".part"), check=True)
        os.replace(q4 + ".part", q4)
        os.remove(bf16)  # as big as the checkpoint: only Q4_0 is benchmarked
    return tools, q4


def llama_bench_command(tool: str, gguf_path: str, threads: int, reps: int) -> list:
    return [tool, "-m", gguf_path, "-p", "512", "-n", "128", "-t", str(threads), "-r", str(reps), "-o", "json"]


def parse_llama_bench(text: str) -> dict:
    """{our workload: (tok/s mean, its stddev)} from llama-bench's JSON output (one object per
    test: pp512 has n_prompt 512, tg128 n_gen 128)."""
    out = {}
    for test in json.loads(text):
        name = LLAMA_TESTS.get((test["n_prompt"], test["n_gen"]))
        if name:
            out[name] = (test["avg_ts"], test["stddev_ts"])
    missing = set(WORKLOADS) - set(out)
    if missing:
        raise ValueError(f"llama-bench printed no test for {sorted(missing)}")
    return out


def gguf_bytes_per_token(gguf_path: str) -> float:
    """Bytes of weights one decode step of one token reads in a GGUF: every matrix but the token
    embedding (a row is gathered; unless the head is tied to it), of the expert tensors the share
    a token chooses (bounds.active_experts; uniform routing, as a random model routes)."""
    import gguf
    from bench.bounds import active_experts
    reader = gguf.GGUFReader(gguf_path)

    def field(suffix):
        key = next((k for k in reader.fields if k.endswith(suffix)), None)
        return int(reader.fields[key].contents()) if key else 0
    share = active_experts(SimpleNamespace(num_experts=field(".expert_count"),
                                           num_experts_per_tok=field(".expert_used_count")), 1)
    gathered = "token_embd.weight" if any(t.name == "output.weight" for t in reader.tensors) else None
    total = 0.0
    for t in reader.tensors:
        if len(t.shape) < 2 or t.name == gathered:
            continue
        total += t.n_bytes * (share if "_exps." in t.name else 1.0)
    return total


def engine_command(model: str, threads: int) -> list:
    return [sys.executable, os.path.join(ROOT, "bench", "engine.py"), "--model", model, "--quant", "uint4",
            "--workloads", ",".join(WORKLOADS), "--threads", str(threads)]


def run_ours(model: str, threads: int) -> dict:
    """{workload: engine.py's JSON line}."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(engine_command(model, threads), env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"bench/engine.py failed:\n{out.stderr[-3000:]}")
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {line["workload"]: line for line in lines if line.get("workload") in WORKLOADS}


def run_theirs(tool: str, gguf_path: str, threads: int, reps: int) -> tuple:
    """(llama-bench's figures, the read bandwidth around its run)."""
    from bench.machine import read_bandwidth
    bw = read_bandwidth(threads)
    out = subprocess.run(llama_bench_command(tool, gguf_path, threads, reps), capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"llama-bench failed:\n{out.stderr[-3000:]}")
    return parse_llama_bench(out.stdout), (bw + read_bandwidth(threads)) / 2


def summary(ours: list, theirs: list, their_bytes: float) -> dict:
    """Medians over rounds; ours/theirs; each side's fraction of the same limits (module doc)."""
    out = {}
    for name, key in (("decode1", "decode_tok_s"), ("prefill512", "prefill_tok_s")):
        our = statistics.median(r[name][key] for r in ours)
        their = statistics.median(t[name] for t in theirs)
        row = {"dashinfer_tok_s": our, "llama_cpp_tok_s": round(their, 1), "ours_over_theirs": round(our / their, 3),
               "target": 1.3}
        if name == "decode1":
            our_bound = statistics.median(r[name]["decode_bound_tok_s"] for r in ours)
            bw = statistics.median(r[name]["bw_gbs"] for r in ours)
            row.update(bw_gbs=bw, dashinfer_bound_tok_s=our_bound,
                       dashinfer_fraction=round(statistics.median(r[name]["decode_fraction"] for r in ours), 3),
                       llama_cpp_mb_per_token=round(their_bytes / 2**20, 1),
                       llama_cpp_bound_tok_s=round(bw * 1e9 / their_bytes, 1),
                       llama_cpp_fraction=round(their * their_bytes / (bw * 1e9), 3),
                       llama_over_our_bound=round(their / our_bound, 3))
        else:
            bound = statistics.median(r[name]["prefill_bound_tok_s"] for r in ours)
            row.update(bf16_gflops=ours[0][name]["bf16_gflops"], bound_tok_s=bound,
                       dashinfer_fraction=round(our / bound, 3), llama_cpp_fraction=round(their / bound, 3))
        out[name] = row
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face directory (Qwen2/Qwen3 dense or MoE, Llama)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs, in the order ABBA...")
    parser.add_argument("--reps", type=int, default=3, help="llama-bench's repetitions of each test per run")
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/dashinfer-py/llama.cpp-0.3.36"))
    parser.add_argument("--sdist", help=f"{SDIST}'s sdist, already downloaded (default: pip download)")
    parser.add_argument("--prepare-only", action="store_true",
                        help="build llama.cpp, convert the model for both sides, measure nothing")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    tools, q4 = prepare(args.model, args.cache, args.sdist)
    from bench import models
    models.resolve(args.model, "bfloat16", "uint4")  # our conversion, cached: not inside a timed run
    if args.prepare_only:
        print(json.dumps({"llama_bench": tools["llama-bench"], "gguf": q4}))
        return
    their_bytes = gguf_bytes_per_token(q4)
    ours, theirs = [], []
    for i in range(args.rounds):
        for side in ("ours", "theirs") if i % 2 == 0 else ("theirs", "ours"):
            load = round(os.getloadavg()[0], 2)
            if side == "ours":
                ours.append(run_ours(args.model, args.threads))
                for name, r in ours[-1].items():
                    print(json.dumps({"side": "dashinfer", "round": i, "load_avg_1min": load, **r}), flush=True)
                continue
            figures, bw = run_theirs(tools["llama-bench"], q4, args.threads, args.reps)
            theirs.append({name: tok_s for name, (tok_s, _) in figures.items()})
            for name, (tok_s, sd) in figures.items():
                print(json.dumps({"side": "llama.cpp", "round": i, "workload": name, "tok_s": round(tok_s, 1),
                                  "stddev_tok_s": round(sd, 1), "bw_gbs": round(bw, 1), "threads": args.threads,
                                  "load_avg_1min": load, "load_avg_after": round(os.getloadavg()[0], 2)}),
                      flush=True)
    print(json.dumps({"model": os.path.basename(args.model.rstrip("/")), "gguf": os.path.basename(q4),
                      "rounds": args.rounds, **summary(ours, theirs, their_bytes)}), flush=True)


if __name__ == "__main__":
    main()
