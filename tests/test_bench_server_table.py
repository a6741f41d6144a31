"""bench/server_table.py on a server without internet: what it installs from the wheels folder
covers every package the benches it runs import."""
import ast
import configparser
import os
import re
import sys
from importlib.metadata import packages_distributions

from bench import gather_wheels, server_table

# what the server brings (the reference) or the project is
THE_SERVERS_OWN = {"torch", "transformers", "safetensors"}
PROJECT = {"bench", "dashinfer", "dashinfer_client", "dashinfer_server"}


def imported_modules(name, seen) -> set:
    """Top-level names bench/<name>.py imports (in functions too), following its bench modules."""
    seen.add(name)
    with open(os.path.join(server_table.ROOT, "bench", name + ".py")) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module == "bench":
                found |= {"bench." + alias.name for alias in node.names}
    top = {m.split(".")[0] for m in found}
    for module in found:
        if module.startswith("bench.") and module[6:] not in seen:
            top |= imported_modules(module[6:], seen)
    return top


def normalized(requirement) -> str:
    return re.split(r"[<>=!;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_install_covers_what_the_benches_import(tmp_path, monkeypatch):
    commands = []
    monkeypatch.setattr(server_table, "run", lambda cmd, env=None, **kw: commands.append(cmd))
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()  # made already: install() goes straight to pip

    class Args:
        wheels = str(tmp_path / "wheels")
    Args.venv = str(venv)
    server_table.install(Args)
    [pip] = commands
    assert pip[pip.index("--find-links") + 1] == Args.wheels and "--no-index" in pip
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(server_table.ROOT, "setup.cfg"))
    installed = {normalized(r) for r in cfg["options"]["install_requires"].splitlines() if r.strip()}
    installed |= {normalized(r) for r in pip[pip.index(server_table.ROOT) + 1:]}
    # and the wheels folder has them: gather_wheels fetches each
    assert installed <= {normalized(r) for r in gather_wheels.requirements()}

    dists = packages_distributions()
    seen = set()
    modules = set().union(*(imported_modules(name, seen)
                            for name in ("server_table", "engine", "machine", "make_model", "hf_generate")))
    third_party = modules - set(sys.stdlib_module_names) - THE_SERVERS_OWN - PROJECT
    assert "psutil" in third_party  # engine.py --ranks: the ranks' peak RSS
    missing = {m for m in third_party if not {normalized(d) for d in dists.get(m, [m])} & installed}
    assert not missing, f"imported by the benches server_table runs, installed by nothing: {missing}"


def test_every_figure_of_ours_in_the_markdown_has_its_fraction():
    machine = {"cpu": "cpu", "cpus": 2, "numa_nodes": 1, "mem_gib": 23.5, "bw_gbs": 30.0, "fp32_gflops": 100.0,
               "bf16_gflops": 200.0, "amx_bf16_gflops": "no AMX", "amx_matmul_gflops": "no AMX tiles",
               "bf16_gemm_path": "vdpbf16ps"}

    def row(workload, weights, ranks="in-process", **figures):
        return {"workload": workload, "weights": weights, "threads": 2, "ranks": ranks, **figures}
    results = {"threads": [2], "rank_threads": 1, "workloads": ["prefill512", "decode1"], "machine": machine,
               "ours": [row("prefill512", "bfloat16", prefill_tok_s=46.7, prefill_fraction=0.27),
                        row("decode1", "bfloat16", decode_tok_s=8.7, decode_fraction=0.62),
                        row("decode1", "bfloat16-uint4", decode_tok_s=12.5, decode_fraction=0.32),
                        row("prefill512", "bfloat16-int8", prefill_tok_s=23.6, prefill_fraction=0.14)],
               "transformers": [{"workload": "decode1", "tok_s": 0.5}]}
    table = server_table.markdown(results)
    assert "| decode1 tok/s | 8.7 (0.62) | - | 0.5 | **17.40x** |" in table
    assert "bfloat16-uint4 decode1 on 2 threads: 12.5 (0.32) tok/s" in table
    assert "bfloat16-int8 prefill512 on 2 threads: 23.6 (0.14) tok/s" in table
