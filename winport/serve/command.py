"""`winport serve`: run SGLang's OpenAI-compatible server on winport's platform.

The server runs as a child process (`python -m sglang.launch_server ...`) that winport watches:
it prints what is happening while the model loads, a ready line with the URL once the server
answers, and on Ctrl-C (or SIGTERM, or the console closing on Windows) it stops the whole process
tree it started, so no scheduler or detokenizer process is left behind. Windows has no process
groups or SIGKILL, so the tree is walked with psutil, which works the same on both systems.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from winport import envs
from winport.platform.launch_policy import engram_map_of, sglang_switches
from winport.serve.args import build_parser

READY_TIMEOUT_S: float = envs.WINPORT_READY_TIMEOUT.get()


class ServeError(RuntimeError):
    """A configuration the server cannot start with (the message says why and what to do)."""


@dataclass
class LaunchPlan:
    """Everything needed to start the SGLang server process."""

    model_path: Path
    device: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    placement: Any = None  # winport.placement.budget.Plan when --vram-gib places the experts
    api_key: str | None = None  # what the readiness probe sends; SGLang gets it through argv

    @property
    def url(self) -> str:
        """Base URL of the server."""
        host = self.argv[self.argv.index("--host") + 1]
        port = self.argv[self.argv.index("--port") + 1]
        shown = "127.0.0.1" if host in {"0.0.0.0", "::"} else host
        return f"http://{shown}:{port}"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_device(requested: str) -> str:
    """auto -> cuda when a CUDA GPU is visible, else cpu; an explicit cuda without a GPU fails."""
    if requested == "auto":
        return "cuda" if _cuda_available() else "cpu"
    if requested == "cuda" and not _cuda_available():
        raise ServeError("--device cuda was asked for, but torch sees no CUDA GPU (winport doctor says why)")
    return requested


# SGLang flags that winport serve sets from its own (the ready line, the API key check and the
# process tree it stops depend on them): given after `--` they would silently disagree.
OWNED_SGLANG_FLAGS = {"--model-path": "--model/--demo", "--host": "--host", "--port": "--port",
                      "--api-key": "--api-key", "--device": "--device", "--tp-size": "--tp", "--tp": "--tp",
                      "--served-model-name": "--served-model-name"}


def split_sglang_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split `winport serve` flags from those after `--`, which go to SGLang's server verbatim (for
    SGLang options winport does not wrap, e.g. `-- --disable-radix-cache`)."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    extra = argv[cut + 1:]
    for arg in extra:
        owned = OWNED_SGLANG_FLAGS.get(arg.split("=", 1)[0])
        if owned:
            raise ServeError(f"{arg.split('=', 1)[0]} after `--`: winport serve sets it itself; use "
                             f"`winport serve {owned} ...` before `--`")
    return argv[:cut], extra


def build_plan(argv: list[str]) -> LaunchPlan:
    """Parse `winport serve` flags and translate them into SGLang's command line and environment."""
    argv, sglang_extra = split_sglang_args(argv)
    args = build_parser().parse_args(argv)
    if args.speculative_algorithm and resolve_device(args.device) == "cpu":
        # Refused before the model is built or converted: nothing else would change the answer.
        raise ServeError(f"--speculative-algorithm {args.speculative_algorithm}: {DRAFT_CPU_REASON}; "
                         "serve without the flag on the CPU")
    if args.demo:
        from winport.demo.build import ensure_demo

        model_path = ensure_demo(args.demo_variant)
    else:
        model_path = Path(args.model).expanduser()
        if not model_path.exists():
            raise ServeError(f"--model {model_path}: no such file or folder")
        from winport.gguf.to_checkpoint import is_gguf_path

        if is_gguf_path(model_path):
            # Converted once into a cached checkpoint folder SGLang loads (winport.gguf.to_checkpoint).
            from winport.gguf import GGUFError
            from winport.gguf.to_checkpoint import gguf_to_checkpoint

            for flag, side in (("--draft-model", args.draft_model), ("--mmproj", args.mmproj)):
                if side is not None and not Path(side).expanduser().exists():
                    raise ServeError(f"{flag} {side}: no such file")
            if not args.served_model_name:
                # Name it after the GGUF (shard suffix dropped), not after the cache folder's hash.
                stem = model_path.name if model_path.is_dir() else model_path.stem
                args.served_model_name = re.sub(r"-\d{5}-of-\d{5}$", "", stem)
            device = resolve_device(args.device)
            try:
                # Sidecars named by flag, else found next to the model: checked (and one SGLang cannot use
                # on this device refused) on the one open of the GGUF, before anything is converted.
                model_path = gguf_to_checkpoint(
                    model_path,
                    # MXFP4 routed experts (UD-Q4_K_XL) load only under SGLang's FP8 quant config:
                    # dense weights then go to block FP8 too; other GGUFs keep bf16 dense weights.
                    dense_fp8=None,
                    draft=Path(args.draft_model).expanduser() if args.draft_model else None,
                    mmproj=Path(args.mmproj).expanduser() if args.mmproj else None,
                    check=lambda _loaded: refuse_unusable_sidecars(device, args.draft_model),
                    # No second copy: SGLang reads the weights from the GGUF (winport.gguf.direct).
                    weights="direct",
                )
            except GGUFError as exc:
                raise ServeError(f"--model {model_path}: {exc}") from None
    if not 0 < args.port < 65536:
        raise ServeError(f"--port {args.port} is not a TCP port")
    device = resolve_device(args.device)
    # PYTHONUTF8: SGLang opens tokenizer_config.json and other JSON files without encoding=, which
    # on Windows means the ANSI code page (cp1252) and fails on DeepSeek's non-ASCII special tokens.
    env: dict[str, str] = {}
    envs.set_for_child(env, envs.WINPORT_PLATFORM, "on")
    envs.set_for_child(env, envs.PYTHONUTF8, "1")
    env.update(sglang_switches(device))
    folder = ModelFolder.read(model_path)
    engram_mapped = folder.engram_map is not None
    if engram_mapped:
        # V4.1 engram tables left in the GGUF: SGLang's processes read them through a memory map
        # (winport.gguf.engram_rows, patch engram_rows_from_gguf).
        envs.set_for_child(env, envs.WINPORT_ENGRAM_GGUF, str(folder.engram_map))
    # SGLang names the model after its path unless told otherwise and refuses a name with ':'
    # (its LoRA "model:adapter" syntax), i.e. every absolute Windows path.
    served_name = args.served_model_name or (f"winport-demo-{args.demo_variant}" if args.demo else model_path.stem)
    if ":" in served_name:
        raise ServeError(f"--served-model-name {served_name!r}: a model name cannot contain ':'")
    sg = [
        "--model-path", str(model_path),
        "--served-model-name", served_name,
        "--host", args.host,
        "--port", str(args.port),
        "--device", device,
        "--tp-size", str(args.tp),
        "--log-level", args.log_level,
        "--trust-remote-code",
    ]
    sg += sidecar_args(folder, device, args.draft_model, args.mmproj)
    if args.speculative_algorithm and "--speculative-algorithm" not in sg:
        sg += dspark_args(folder)
    if device == "cpu" and args.vram_gib is not None:
        raise ServeError("--vram-gib caps GPU memory, but the server runs on the CPU (no CUDA GPU)")
    # Device defaults (KV pool size on CPU, CUDA graphs, the MoE runner, custom all-reduce) are the
    # platform's (winport.platform.launch_policy), applied as SGLang resolves its arguments.
    if device != "cpu" and engram_mapped and envs.WINPORT_CUDA_GRAPH.get():
        print("winport serve: engram tables are read from the GGUF's memory map on the host: CUDA graphs "
              "are off for this model", flush=True)
    gpu_experts = args.gpu_experts
    placement = None
    max_running = running_requests(args, device)
    # A draft only found next to the model (not asked for) is left out when kt-kernel will run experts.
    found_draft = "--speculative-algorithm" in sg and not args.speculative_algorithm and args.draft_model is None
    if found_draft and gpu_experts is not None:
        sg = without_found_draft(sg)
        found_draft = False
    if device != "cpu" and args.vram_gib is not None:
        placement = place_experts(folder, args, "--speculative-algorithm" in sg, max_running)
        if found_draft and placement.slots < placement.inputs.sizes.experts_per_layer:
            sg = without_found_draft(sg)
            placement = place_experts(folder, args, False, max_running)
        print(f"winport serve: {placement.describe()}".replace("\n", "\nwinport serve: "), flush=True)
        if placement.slots < placement.inputs.sizes.experts_per_layer:
            gpu_experts = placement.slots
        # SGLang sizes its KV pools from the fraction (weights + KV over the free memory), which
        # the plan's KV line is; activations and graphs take the rest of the budget.
        sg += ["--mem-fraction-static", f"{placement.mem_fraction_static:.5f}"]
    if args.api_key:
        sg += ["--api-key", args.api_key]
    if args.context_length:
        sg += ["--context-length", str(args.context_length)]
    if max_running is not None:
        sg += ["--max-running-requests", str(max_running)]
    if args.tp < 1:
        raise ServeError(f"--tp {args.tp}: the tensor-parallel size must be at least 1")
    if device == "cpu" and args.tp > 1:
        envs.set_for_child(env, envs.SGLANG_CPU_OMP_THREADS_BIND,
                           envs.SGLANG_CPU_OMP_THREADS_BIND.raw() or cpu_thread_bind(args.tp))
        # numpy's OpenBLAS starts its worker threads at import, before a rank is bound to its CPUs
        # (winport.patches.cpu_tp_thread_binding); sized to one rank's share they do not overlap.
        envs.set_for_child(env, envs.OPENBLAS_NUM_THREADS, envs.OPENBLAS_NUM_THREADS.raw() or str(
            max(1, (os.cpu_count() or 1) // args.tp)))
    if args.cpu_threads:
        envs.set_for_child(env, envs.OMP_NUM_THREADS, str(args.cpu_threads))
    from winport.hybrid.serve_plan import expert_plan

    try:
        experts = expert_plan(device, args.tp, gpu_experts, None)
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    print(f"winport serve: {experts.line}", flush=True)
    sg += experts.argv
    env.update(experts.env)
    route_record_env(args, model_path, device, gpu_experts, experts, env)
    # Last, so that a flag given after `--` wins over winport's choice of the same flag (argparse
    # keeps the last occurrence).
    sg += sglang_extra
    return LaunchPlan(model_path=model_path, device=device, argv=sg, env=env, placement=placement,
                      api_key=args.api_key)


def route_record_env(args: Any, model_path: Path, device: str, gpu_experts: int | None, experts: Any,
                     env: dict[str, str]) -> None:
    """--record-experts and --expert-placement: checked here (before loading), passed on in `env`."""
    import json

    from winport.hybrid.route_record import check_model, load
    from winport.hybrid.settings import ENV_ENABLE

    kt_on = experts.env.get(ENV_ENABLE) == "1"
    if args.record_experts is not None:
        out = Path(args.record_experts).expanduser().resolve()
        if not kt_on:
            raise ServeError(f"--record-experts {args.record_experts}: the routes are counted in kt-kernel's MoE "
                             f"layers, and this server does not use them ({experts.line})")
        if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
            raise ServeError(f"--record-experts {args.record_experts}: {out.parent} is not a folder this user can "
                             "write to")
        envs.set_for_child(env, envs.WINPORT_EXPERTS_RECORD, str(out))
    if args.expert_placement is not None:
        flag = f"--expert-placement {args.expert_placement}"
        if device == "cpu" or not kt_on or not gpu_experts:
            raise ServeError(f"{flag}: places GPU expert slots, and this server has none ({experts.line})")
        src = Path(args.expert_placement).expanduser().resolve()
        try:
            config = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
            check_model(load(src), config, f"route record {src}")
        except (OSError, ValueError) as exc:  # RecordError is a ValueError
            raise ServeError(f"{flag}: {exc}") from None
        envs.set_for_child(env, envs.WINPORT_EXPERT_PLACEMENT, str(src))
        print(f"winport serve: GPU expert slots start from the most-routed experts in {src}", flush=True)


# Why a DSpark draft found next to the model is not used once routed experts run in kt-kernel.
DRAFT_HYBRID_REASON = ("with routed experts in kt-kernel a verify block costs more than the tokens it accepts "
                       "save (projected: scripts/bench/decode_budget.py, numbers in scripts/bench/RESULTS.md); "
                       "--speculative-algorithm DSPARK uses it anyway")


def without_found_draft(sg: list[str]) -> list[str]:
    """`sg` without the DSpark flags sidecar_args added for a found draft, saying why."""
    i = sg.index("--speculative-algorithm")
    if sg[i:i + 4] != ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", sg[i + 3]]:
        raise RuntimeError(f"unexpected DSpark flags {sg[i:i + 4]}")
    print(f"winport serve: DSpark draft found next to the model but not used: {DRAFT_HYBRID_REASON}", flush=True)
    return sg[:i] + sg[i + 4:]


def running_requests(args: Any, device: str) -> int | None:
    """--max-running-requests, or on CUDA winport's workstation default (None: SGLang's, on the CPU,
    whose KV pool winport sizes by tokens instead)."""
    from winport.placement.kv import WORKSTATION_RUNNING_REQUESTS

    if args.max_running_requests is not None:
        if args.max_running_requests < 1:
            raise ServeError("--max-running-requests must be at least 1")
        return int(args.max_running_requests)
    return WORKSTATION_RUNNING_REQUESTS if device != "cpu" else None


def place_experts(folder: ModelFolder, args: Any, with_draft: bool, max_running: int | None) -> Any:
    """The --vram-gib plan (winport.placement) for the folder SGLang loads on this machine's GPU
    (max_running is None only on the CPU, where there is no plan)."""
    from winport.placement.budget import PlanError
    from winport.placement.cli import card, host_ram, plan_for
    from winport.placement.kv import MAX_RUNNING_REQUESTS
    from winport.placement.source import SourceError, folder_source

    found = card()
    if found is None:
        raise ServeError("--vram-gib: torch sees no CUDA GPU")
    try:
        source = folder_source(folder.path)
        if not with_draft:
            source = dataclasses.replace(source, draft_bytes=0)
        return plan_for(source, vram_gib=args.vram_gib, context_length=args.context_length,
                        gpu_experts=args.gpu_experts, card_bytes=found[0], card_name=found[1], host_bytes=host_ram(),
                        max_running=max_running or MAX_RUNNING_REQUESTS)
    except (PlanError, SourceError) as exc:
        raise ServeError(str(exc)) from None


# Why SGLang 0.5.23 cannot use a sidecar here (the file is still checked and converted).
DRAFT_CPU_REASON = ("SGLang 0.5.23 runs DSpark speculative decoding only on CUDA, NPU or XPU devices "
                    "(sglang/srt/arg_groups/speculative_hook.py, _handle_dspark), and this server runs on the CPU")


def refuse_unusable_sidecars(device: str, draft_flag: object) -> None:
    """Refuse, before the long model conversion, a sidecar named by flag that SGLang cannot use on this
    device (called by gguf_to_checkpoint once it has checked the sidecars, winport.gguf.vision included)."""
    if draft_flag is not None and device == "cpu":
        raise ServeError(f"--draft-model {draft_flag}: {DRAFT_CPU_REASON}. The file was checked: it is a usable "
                         "DSpark draft; leave the flag out to serve without it")


@dataclass(frozen=True)
class ModelFolder:
    """What `winport serve` needs from the folder SGLang loads, read from it once (ModelFolder.read)."""

    path: Path
    sidecars: dict[str, Any]  # a converted GGUF's bundled sidecars (winport.gguf.to_checkpoint.sidecars)
    config_keys: frozenset[str] | None  # config.json's keys; None when it cannot be read (config_error says why)
    config_error: str | None
    engram_map: Path | None  # engram_gguf.json when the engram tables stay in the GGUF's memory map

    @classmethod
    def read(cls, path: Path) -> ModelFolder:
        """Read the stamp, config.json and the engram map of `path` (missing files are recorded, not raised)."""
        import json

        from winport.gguf.to_checkpoint import sidecars

        config = Path(path) / "config.json"
        keys: frozenset[str] | None = None
        error = None
        try:
            keys = frozenset(json.loads(config.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            error = f"cannot read {config}: {exc}"
        return cls(Path(path), sidecars(path), keys, error, engram_map_of(path))


def sidecar_args(folder: ModelFolder, device: str, draft_flag: object, mmproj_flag: object) -> list[str]:
    """SGLang flags for the sidecars bundled in a converted GGUF checkpoint (see winport.gguf.to_checkpoint).

    DSpark draft: ``--speculative-algorithm DSPARK`` with the draft path = the checkpoint itself (SGLang's
    convention for a draft bundled as mtp.* tensors + dspark_* config keys). A sidecar SGLang cannot use
    is a ServeError when its flag was given, and a printed note when it was only found next to the model.
    Vision projector: bundled in the checkpoint (vision tensors + vision_* config keys), which SGLang
    serves as it is (it turns on its V4.1 image processor for such a config); no flag needed.
    """
    side = folder.sidecars
    out: list[str] = []
    if "draft" in side:
        if device == "cpu":
            if draft_flag is not None:  # check_sidecar_flags refuses this before converting
                raise ServeError(f"--draft-model {draft_flag}: {DRAFT_CPU_REASON}")
            print(f"winport serve: DSpark draft found next to the model but not used: {DRAFT_CPU_REASON}", flush=True)
        else:
            out += ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(folder.path)]
    if "mmproj" in side:
        src = side["mmproj"]["source"][0]
        print(f"winport serve: vision projector {src} bundled into the model: image inputs are served", flush=True)
    return out


# config.json keys that mark a DSpark draft bundled in the checkpoint (SGLang 0.5.23:
# speculative/dspark_components/dspark_config.py checkpoint_bundles_dspark_draft).
DSPARK_BUNDLE_KEYS = ("dspark_block_size", "dspark_markov_rank", "dspark_noise_token_id", "dspark_target_layer_ids")


def dspark_args(folder: ModelFolder) -> list[str]:
    """SGLang flags for DSpark with the draft bundled in the checkpoint folder (mtp.* tensors +
    dspark_* keys); a ServeError names the folder when its config.json bundles no draft."""
    config = folder.path / "config.json"
    if folder.config_keys is None:
        raise ServeError(f"--speculative-algorithm DSPARK: {folder.config_error}")
    if not folder.config_keys & set(DSPARK_BUNDLE_KEYS):
        raise ServeError(f"--speculative-algorithm DSPARK: {config} bundles no DSpark draft (none of "
                         f"{', '.join(DSPARK_BUNDLE_KEYS)}); the V4.1 demo (--demo --demo-variant v41) has one, "
                         "and a GGUF model gets one from --draft-model")
    return ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(folder.path)]


def cpu_thread_bind(ranks: int, cpus: int | None = None) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND for `ranks` CPU ranks: the logical CPUs split into equal ranges.

    SGLang's CPU engine binds one rank per NUMA node unless told which CPUs each rank gets;
    a workstation (and this 2-core machine) has fewer nodes than ranks.
    """
    cpus = cpus or os.cpu_count() or 1
    per = cpus // ranks
    if per < 1:
        raise ServeError(f"--tp {ranks} on the CPU needs at least {ranks} CPUs; this machine has {cpus}")
    return "|".join(f"{r * per}-{r * per + per - 1}" for r in range(ranks))


def _health(url: str, api_key: str | None) -> bool:
    req = urllib.request.Request(url + "/v1/models")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


def report_memory(plan: LaunchPlan, pid: int) -> None:
    """Print what SGLang holds on the GPU (its /server_info memory_usage, and the driver's count for
    the server's processes) next to the --vram-gib plan."""
    import json

    import psutil

    from winport.placement.actual import compare, cuda_held_bytes
    from winport.placement.budget import gib

    req = urllib.request.Request(plan.url + "/server_info")
    if plan.api_key:
        req.add_header("Authorization", f"Bearer {plan.api_key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            info = json.loads(resp.read())
    except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
        print(f"winport serve: could not read what the GPU holds from {plan.url}/server_info ({exc})", flush=True)
        return
    for line in compare(plan.placement, info):
        print(f"winport serve: {line}", flush=True)
    try:
        pids = [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return
    held = cuda_held_bytes(pids)
    if held is not None:
        print(f"winport serve: the server's processes hold {gib(held)} of the GPU (nvidia-smi), budget "
              f"{gib(plan.placement.budget)}", flush=True)


def stop_tree(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> list[int]:
    """Terminate proc and every descendant; kill what is still alive after grace_s. Returns the pids."""
    import psutil

    try:
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for p in reversed(tree):
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in tree]


# How long the server gets to stop by itself after the stop signal: in-flight requests finish
# (uvicorn), then the schedulers leave their loop (SGLang waits up to 15 s for them) and the rest is
# killed (winport.patches.quiet_stop). A second Ctrl-C, or this bound, ends the wait.
STOP_GRACE_S = 30.0


def stop_signal() -> int:
    """The signal that asks SGLang's launcher to stop in order: CTRL_BREAK on Windows (the one console
    event a process group can be sent), SIGINT elsewhere."""
    return signal.CTRL_BREAK_EVENT if sys.platform == "win32" else signal.SIGINT  # type: ignore[attr-defined]


def stop_server(proc: subprocess.Popen[bytes], again: threading.Event | None = None,
                grace_s: float = STOP_GRACE_S) -> list[int]:
    """Stop the server the way SGLang expects: one stop signal to its launcher, which stops its
    children in order (winport.patches.quiet_stop); then whatever is left of the tree, by force
    (stop_tree). `again` is set by a second Ctrl-C, which cuts the wait short. Returns the pids."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    if proc.poll() is None:
        if again is not None:
            again.clear()
        try:
            proc.send_signal(stop_signal())
        except OSError:
            pass  # no console to send CTRL_BREAK through: stop_tree below does it by force
        else:
            deadline = time.monotonic() + grace_s
            while proc.poll() is None and time.monotonic() < deadline and not (again and again.is_set()):
                try:
                    proc.wait(0.1)
                except subprocess.TimeoutExpired:
                    pass
    if proc.poll() is None:
        stop_tree(proc, grace_s=5.0)
    # What outlived the launcher (psutil checks each pid is still the process listed, not a reused one).
    left = []
    for p in tree:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                p.kill()
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=5)
    from winport.patches.loopback_distributed import remove_store_files

    remove_store_files(proc.pid)
    return [p.pid for p in tree]


def _pump(stream, sink) -> None:  # type: ignore[no-untyped-def]
    for line in iter(stream.readline, b""):
        sink.write(line.decode(errors="replace"))
        sink.flush()


def launch(plan: LaunchPlan) -> subprocess.Popen[bytes]:
    """Start SGLang's server process for `plan`, its output copied to this process's stdout."""
    env = envs.child_environ(plan.env)
    print(f"winport serve: model {plan.model_path} on {plan.device}", flush=True)
    # -X utf8 as well as PYTHONUTF8: the flag also holds where environment variables are ignored
    # (isolated interpreters) and multiprocessing passes it on to the processes SGLang spawns.
    cmd = [sys.executable, "-X", "utf8", "-m", "sglang.launch_server", *plan.argv]
    kwargs: dict[str, object] = {}
    if sys.platform == "win32":
        kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined]
    else:
        # Its own session: a terminal's Ctrl-C reaches winport serve only, which stops the server in
        # order (stop_server), as Windows' new process group does for the console's Ctrl-C.
        kwargs["start_new_session"] = True
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)
    threading.Thread(target=_pump, args=(proc.stdout, sys.stdout), daemon=True).start()
    return proc


def wait_ready(plan: LaunchPlan, proc: subprocess.Popen[bytes], stopping: threading.Event) -> bool:
    """Wait until the server answers (True; the ready line printed, the memory report made), it
    exits, READY_TIMEOUT_S passes, or `stopping` is set (False, with a line saying which)."""
    start = time.monotonic()
    while not stopping.is_set():
        if proc.poll() is not None:
            print(f"winport serve: the server exited with code {proc.returncode} before it was ready",
                  file=sys.stderr, flush=True)
            return False
        if _health(plan.url, plan.api_key):
            print(f"winport serve: ready at {plan.url} (OpenAI API: {plan.url}/v1) after "
                  f"{time.monotonic() - start:.0f} s; Ctrl-C stops it", flush=True)
            if plan.placement is not None:
                report_memory(plan, proc.pid)
            return True
        if time.monotonic() - start > READY_TIMEOUT_S:
            print(f"winport serve: not ready after {READY_TIMEOUT_S:.0f} s; stopping", file=sys.stderr)
            return False
        stopping.wait(1.0)
    return False


def on_stop_signals(stopping: threading.Event) -> None:
    """Ctrl-C, SIGTERM (and Ctrl-Break or the console closing on Windows) set `stopping`."""

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if hasattr(signal, "SIGBREAK"):
        signal.signal(signal.SIGBREAK, on_signal)  # Ctrl-Break / console close on Windows


def run(plan: LaunchPlan) -> int:
    """Start the server, report progress and readiness, and stop the process tree on exit."""
    proc = launch(plan)
    stopping = threading.Event()
    on_stop_signals(stopping)
    try:
        if wait_ready(plan, proc, stopping):
            while not stopping.is_set() and proc.poll() is None:
                stopping.wait(1.0)
            if proc.poll() is not None:
                print(f"winport serve: the server exited with code {proc.returncode}", file=sys.stderr, flush=True)
                return proc.returncode or 1
        elif not stopping.is_set():
            return (proc.returncode or 1) if proc.poll() is not None else 1
        print("winport serve: stopping", flush=True)
        return 0
    finally:
        pids = stop_server(proc, stopping)
        if pids:
            print(f"winport serve: stopped {len(pids)} process(es)", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `winport serve`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        plan = build_plan(argv)
    except ServeError as exc:
        print(f"winport serve: {exc}", file=sys.stderr)
        return 2
    code = run(plan)
    # The server's processes are all stopped. Left is this interpreter's own teardown of torch and
    # kt-kernel (imported only to plan the launch), which took 6-7 s of a stop on 2 busy cores and
    # has nothing to save: skipped.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
