"""The `winport` command line. Subcommands import their modules lazily, so `winport install`
runs with the standard library alone and `winport --help` is instant."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, function, one-line help); each function takes argv and returns an exit code.
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "install": ("winport.install.installer", "main", "create .venv and install the port into it"),
    "doctor": ("winport.doctor", "main", "report what this machine has for the port"),
    "serve": ("winport.serve.command", "main", "run the OpenAI-compatible server (--demo for the tiny model)"),
    "plan": ("winport.placement.cli", "main", "the GPU budget of a model and the experts a layer it leaves (--vram-gib N)"),
    "experts": ("winport.hybrid.experts_cli", "main", "record the routes a workload takes (record FILE) and read a record (show FILE)"),
    "demo-model": ("winport.demo.command", "main", "write the tiny DeepSeek-V4 demo checkpoint"),
    "gguf": ("winport.gguf.cli", "main", "GGUF files: info FILE | dump FILE TENSOR --npy OUT | export CHECKPOINT OUT.gguf"),
    "lock": ("winport.install.lock", "main", "write requirements/windows.in and resolve windows.lock with uv"),
    "envs": ("winport.envs", "main", "the environment variables winport reads or sets (--markdown: the README's table)"),
}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="winport",
        description="DeepSeek-V4.x on SGLang + kt-kernel, natively on Windows.",
        epilog="Run `winport <command> --help` for a command's options.",
    )
    sub = ap.add_subparsers(dest="command", metavar="command")
    for name, (_, _, text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = _parser()
    if not argv or argv[0] in {"-h", "--help"}:
        ap.print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        ap.error(f"unknown command {name!r} (choose from {', '.join(SUBCOMMANDS)})")
    module_name, func_name, _ = SUBCOMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == module_name or module_name.startswith(exc.name + ".")):
            print(f"winport {name}: not built yet in this version ({module_name} is missing)", file=sys.stderr)
            return 3
        print(f"winport {name}: a dependency is missing ({exc}); run `python -m winport install`",
              file=sys.stderr)
        return 3
    return int(getattr(module, func_name)(rest) or 0)
