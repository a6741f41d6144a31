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
