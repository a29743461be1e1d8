"""Every environment variable the project reads or sets: name, type, default and why, in one table.

Code reads a variable through its declaration here (`envs.WINPORT_CACHE.get()`), never through
`os.environ`: the declaration parses it (one rule for booleans: 1/true/yes/on and 0/false/no/off,
case-insensitive; anything else is an error naming the variable) and documents it. The variables
the kernels read live in the leaf module `kernels_triton._env` (kernels cannot import winport) and
are part of the same table, `VARIABLES`. Variables another program defines (SGLang, Triton,
kt-kernel, OpenMP, ...) are listed too, with that program as their owner: for a foreign boolean,
winport accepts only the spellings its owner reads the same way.

`winport envs --markdown` (`python -m winport envs --markdown`) prints the table the README carries between
its `<!-- envs:begin -->` and `<!-- envs:end -->` markers (tests/foundation/test_envs.py checks it).

Standard library only: imported at interpreter start (winport._bootstrap, winport.platform.windows_compat).
"""

from __future__ import annotations

import sys

from kernels_triton._env import (
    FALSE_SPELLINGS,
    KERNEL_VARIABLES,
    TRITON_INTERPRET,
    TRUE_SPELLINGS,
    WINPORT_FP8_GEMM_CONFIG,
    WINPORT_FP8_GEMV_CONFIG,
    WINPORT_FP8_GEMV_PDL,
    WINPORT_TRITON_ON_CPU,
    EnvError,
    EnvVar,
    child_environ,
    parse_bool,
    set_default,
    set_for_child,
)

__all__ = [
    "FALSE_SPELLINGS", "TRUE_SPELLINGS", "VARIABLES", "EnvError", "EnvVar", "child_environ", "markdown_table",
    "parse_bool", "set_default", "set_for_child",
    "TRITON_INTERPRET", "WINPORT_FP8_GEMM_CONFIG", "WINPORT_FP8_GEMV_CONFIG", "WINPORT_FP8_GEMV_PDL",
    "WINPORT_TRITON_ON_CPU",
]

# SGLang reads its booleans with get_bool_env_var: true/1 on, false/0 off (anything else off with a warning).
_SGL_TRUE, _SGL_FALSE = ("1", "true"), ("0", "false")
# kt-kernel compares its switches with "1".
_KT_TRUE, _KT_FALSE = ("1",), ("0",)


def _sglang(name: str, why: str, type_: str = "bool", default: object = False) -> EnvVar:
    if type_ == "bool":
        return EnvVar(name, type_, default, why, owner="SGLang", true=_SGL_TRUE, false=_SGL_FALSE)
    return EnvVar(name, type_, default, why, owner="SGLang")


# --- winport's own -----------------------------------------------------------------------------
WINPORT_EMULATE_WINDOWS = EnvVar(
    "WINPORT_EMULATE_WINDOWS", "bool", False,
    why="On Linux, make POSIX-only and Linux-only modules unimportable and reject ipc:// (winport.winemu), "
        "so tests run the code paths Windows will; also turns on the Windows-only import hooks.")
WINPORT_PLATFORM = EnvVar(
    "WINPORT_PLATFORM", "choice", "auto", choices=("auto", "on", "off"),
    why="Offer winport's SGLang platform and patches: auto = on Windows or under WINPORT_EMULATE_WINDOWS; "
        "`winport serve` sets it on for its server.")
WINPORT_SHIMS = EnvVar(
    "WINPORT_SHIMS", "choice", "auto", choices=("auto", "force", "off"),
    why="Map sgl_kernel, flashinfer, ... to winport's shims: auto = where the real library is missing, "
        "force = always (tests the shims on Linux), off = never.")
WINPORT_CACHE = EnvVar(
    "WINPORT_CACHE", "path", None,
    default_text="`%LOCALAPPDATA%\\winport` on Windows, else `$XDG_CACHE_HOME/winport` or `~/.cache/winport`",
    why="Where generated and cached files go: the demo model, the small folders a served GGUF needs "
        "(config, tokenizer, sidecars: its weights stay in the GGUF) and `winport gguf convert`'s work "
        "(winport.paths.cache_dir).")
WINPORT_READY_TIMEOUT = EnvVar(
    "WINPORT_READY_TIMEOUT", "float", 1800.0,
    why="Seconds `winport serve` waits for the server to answer before it stops it (loading a large model "
        "takes minutes).")
WINPORT_CUDA_GRAPH = EnvVar(
    "WINPORT_CUDA_GRAPH", "bool", True,
    why="0 runs decode eagerly instead of in CUDA graphs (a debugging aid: slower, same results).")
WINPORT_GPU_MXFP4_MOE = EnvVar(
    "WINPORT_GPU_MXFP4_MOE", "bool", False,
    why="Opt-in: MXFP4 routed experts stay 4-bit on CUDA and run in winport's Triton W4A16 kernel "
        "(winport.patches.cuda_mxfp4_moe) instead of being dequantized to FP8 at load.")
WINPORT_CPU_TORCH_KERNELS = EnvVar(
    "WINPORT_CPU_TORCH_KERNELS", "bool", True,
    why="0 leaves SGLang's DeepSeek-V4 rope and indexer Triton kernels (interpreted on CPU) in place of "
        "winport's torch versions (benchmarks compare the two).")
WINPORT_ENGRAM_GGUF = EnvVar(
    "WINPORT_ENGRAM_GGUF", "path", None, default_text="unset",
    why="Set by `winport serve` for its server: the GGUF folder's engram_gguf.json, whose tables "
        "SGLang's processes read from the GGUF's memory map (winport.patches.engram_rows_from_gguf).")
WINPORT_KT_MOE = EnvVar(
    "WINPORT_KT_MOE", "bool", False, default_text="set by `winport serve`",
    why="1: winport's kt-kernel MoE method serves the routed experts (winport.hybrid); `winport serve` sets it "
        "for a CPU server or with --gpu-experts N; 0 keeps the torch/Triton experts.")
WINPORT_HOT_EXPERTS = EnvVar(
    "WINPORT_HOT_EXPERTS", "bool", None, default_text="on with CUDA, off on the CPU",
    why="Whether a hybrid layer's GPU expert slots follow decayed route counts, swapped between decode steps from "
        "the checkpoint's files (winport.hybrid.hot_swap; on CUDA the swaps never block decode, "
        "winport.hybrid.swap_stream); 0 keeps the start placement.")
WINPORT_HOT_EXPERTS_INTERVAL = EnvVar(
    "WINPORT_HOT_EXPERTS_INTERVAL", "int", None, default_text="winport.hybrid.hot_experts.DEFAULT_INTERVAL",
    why="Decode steps between two refreshes of the GPU expert slots.")
WINPORT_HOT_EXPERTS_DECAY = EnvVar(
    "WINPORT_HOT_EXPERTS_DECAY", "float", None, default_text="winport.hybrid.hot_experts.DEFAULT_DECAY",
    why="Per-step decay of the route counts the GPU expert slots follow, in (0, 1].")
WINPORT_EXPERTS_RECORD = EnvVar(
    "WINPORT_EXPERTS_RECORD", "path", None, default_text="unset",
    why="Set by `winport serve --record-experts FILE`: the hybrid layers count their routes and the scheduler writes "
        "them to FILE whenever it goes idle (winport.hybrid.route_record).")
WINPORT_EXPERT_PLACEMENT = EnvVar(
    "WINPORT_EXPERT_PLACEMENT", "path", None, default_text="unset",
    why="Set by `winport serve --expert-placement FILE`: each hybrid layer's GPU slots start with the experts FILE "
        "recorded as most routed there, instead of experts 0..N-1 (winport.hybrid.route_record).")
WINPORT_GGUF_THREADS = EnvVar(
    "WINPORT_GGUF_THREADS", "int", None, default_text="torch's intra-op threads",
    why="Worker threads for load-time GGUF conversion.")
WINPORT_GGUF_KEEP_PAGE_CACHE = EnvVar(
    "WINPORT_GGUF_KEEP_PAGE_CACHE", "bool", False,
    why="1 keeps a GGUF's bytes in the page cache once loading has copied them into place (by default they are "
        "dropped, so the machine holds the weights once; keep them where RAM holds both copies and the server "
        "restarts often, or to benchmark warm re-reads).")
WINPORT_GGUF_REPACK_CHUNK = EnvVar(
    "WINPORT_GGUF_REPACK_CHUNK", "int", None, default_text="32768, or 131072 from 8 conversion threads",
    why="MXFP4 blocks per repacking work item (winport.gguf.mxfp4_repack.chunk_blocks), read at import.")
WINPORT_GGUF_DEQUANT_CHUNK = EnvVar(
    "WINPORT_GGUF_DEQUANT_CHUNK", "int", 1 << 22,
    why="Values per numpy dequantization call (bounds the float32 temporaries), read at import.")

# --- winport's tests and scripts (read there, listed here so the table is complete) --------------
_TESTS = "winport tests"
WINPORT_RECORD_TRITON = EnvVar(
    "WINPORT_RECORD_TRITON", "bool", False, owner=_TESTS,
    why="Record the specializations of every kernels_triton launch during tests/ops (tests/ops/triton_specializations.py).")
WINPORT_TRITON_COMPILE_PROCS = EnvVar(
    "WINPORT_TRITON_COMPILE_PROCS", "int", 2, owner=_TESTS,
    why="Worker processes of tests/ops/test_triton_compile.py.")
WINPORT_TEST_SERVER_LOG_DIR = EnvVar(
    "WINPORT_TEST_SERVER_LOG_DIR", "path", None, default_text="unset", owner=_TESTS,
    why="Folder the live server tests keep server logs and parity records in, for analysis after a GPU run.")
WINPORT_VISION_CAPTURE_DIR = EnvVar(
    "WINPORT_VISION_CAPTURE_DIR", "path", None, default_text="unset", owner=_TESTS,
    why="Set by tests/serve/test_vision_live.py: where its server child saves the image tensors it saw.")
WINPORT_WINE_DIR = EnvVar(
    "WINPORT_WINE_DIR", "path", None, default_text="`.cache/wine/` in the repository", owner=_TESTS,
    why="Where the Wine tier keeps its Windows Python and wheels (tests/windows/wine_harness.py).")
WINPORT_WINE_PROGRESS = EnvVar(
    "WINPORT_WINE_PROGRESS", "path", None, default_text="unset", owner=_TESTS,
    why="File the Wine tier's pytest plugin writes each test's start and outcome to.")
WINPORT_WINE_RESUME_FROM = EnvVar(
    "WINPORT_WINE_RESUME_FROM", "str", None, default_text="unset", owner=_TESTS,
    why="Node id the Wine tier resumes from (earlier tests are deselected).")
WINPORT_JIT_PROBE_FILE = EnvVar(
    "WINPORT_JIT_PROBE_FILE", "path", None, default_text="unset", owner=_TESTS,
    why="scripts/gpu/serve_demo.sh: file its probe writes every CUDA JIT compile the server attempts to.")
WINPORT_REPO = EnvVar(
    "WINPORT_REPO", "path", None, default_text="unset", owner=_TESTS,
    why="scripts/gpu/serve_demo.sh: the repository root, for the probe's sitecustomize.")

# --- other programs' variables that winport reads or sets -----------------------------------------
SGLANG_USE_CPU_ENGINE = _sglang(
    "SGLANG_USE_CPU_ENGINE",
    "SGLang's CPU engine; set by `winport serve` on the CPU, read by the plugin to pick the CPU platform.")
SGLANG_CRASH_ON_JIT_COMPILE = _sglang(
    "SGLANG_CRASH_ON_JIT_COMPILE",
    "Set on: a CUDA JIT kernel no shim replaces fails at once, by name, instead of trying nvcc.")
SGLANG_OPT_USE_FUSED_HASH_TOPK = _sglang(
    "SGLANG_OPT_USE_FUSED_HASH_TOPK",
    "Set off: hash-routed MoE layers use SGLang's torch routing instead of the fused JIT kernel.", default=True)
SGLANG_ENABLE_JIT_DEEPGEMM = _sglang(
    "SGLANG_ENABLE_JIT_DEEPGEMM",
    "Set off: DeepGEMM's JIT is Linux-only; winport's deep_gemm shim serves the names SGLang calls.", default=True)
SGLANG_IS_FLASHINFER_AVAILABLE = _sglang(
    "SGLANG_IS_FLASHINFER_AVAILABLE",
    "Set false: SGLang takes its torch/Triton/sgl_kernel routes instead of ~40 flashinfer modules with "
    "no Windows build.", default=True)
SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK = _sglang(
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK",
    "Set on: winport's sgl_kernel is a shim module with no distribution version to check.")
SGLANG_DSV4_FP4_DEQUANT = _sglang(
    "SGLANG_DSV4_FP4_DEQUANT",
    "Set on CUDA unless WINPORT_GPU_MXFP4_MOE: MXFP4 experts are dequantized to FP8 blocks at load "
    "(SGLang's flashinfer MXFP4 MoE has no Windows build).")
SGLANG_FP8_PAGED_MQA_LOGITS_TORCH = _sglang(
    "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH",
    "Set on the CPU: SGLang's torch implementation of the indexer's paged MQA logits.")
SGLANG_OPT_FP8_WO_A_GEMM = _sglang(
    "SGLANG_OPT_FP8_WO_A_GEMM",
    "Set off on the CPU: DeepSeek-V4's FP8 wo_a is dequantized to bf16 at load instead of the W8A8 einsum.",
    default=True)
SGLANG_CPU_OMP_THREADS_BIND = _sglang(
    "SGLANG_CPU_OMP_THREADS_BIND",
    "CPUs of each CPU rank (`0-3|4-7`); `winport serve --tp N` on the CPU sets equal ranges unless given.",
    type_="str", default=None)
SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS = _sglang(
    "SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS",
    "Given the default 8192 on Windows, whose libzmq refuses SGLang's 16384 (winport.platform.windows_compat).",
    type_="int", default=16384)
OMP_NUM_THREADS = EnvVar(
    "OMP_NUM_THREADS", "int", None, owner="OpenMP", default_text="the rank's CPUs",
    why="Set by `winport serve --cpu-threads`; a CPU rank bound to its CPUs uses it as its torch thread count.")
OPENBLAS_NUM_THREADS = EnvVar(
    "OPENBLAS_NUM_THREADS", "int", None, owner="OpenBLAS", default_text="CPUs / ranks",
    why="Set for `--tp N` on the CPU: numpy's OpenBLAS threads start before a rank is bound, so they are sized "
        "to one rank's share.")
KT_KERNEL_CPU_VARIANT = EnvVar(
    "KT_KERNEL_CPU_VARIANT", "str", None, owner="kt-kernel", default_text="cpuid",
    why="kt-kernel's override of its CPU variant, honoured by winport's variant choice (winport.ktkernel).")
KT_FORCE_SYNC_SUBMIT = EnvVar(
    "KT_FORCE_SYNC_SUBMIT", "bool", False, owner="kt-kernel", true=_KT_TRUE, false=_KT_FALSE,
    why="Set to 1 for a CPU-only server: kt-kernel's only path that computes on CPU tensors (its stream "
        "path returns zeros there without an error; winport.hybrid.kt_experts refuses it).")
KT_KERNEL_DEBUG = EnvVar(
    "KT_KERNEL_DEBUG", "bool", False, owner="kt-kernel", true=_KT_TRUE, false=_KT_FALSE,
    why="kt-kernel's debug output; winport's extension loader prints what it chose too.")
NCCL_SOCKET_IFNAME = EnvVar(
    "NCCL_SOCKET_IFNAME", "str", None, owner="NCCL", default_text="NCCL's choice",
    why="Set to `lo` in a one-machine server's ranks on Linux unless given (winport.patches.loopback_distributed): "
        "NCCL's bootstrap sockets stay on loopback.")
GLOO_SOCKET_IFNAME = EnvVar(
    "GLOO_SOCKET_IFNAME", "str", None, owner="gloo", default_text="the host name's interface",
    why="Ignored on one machine with torch 2.14 (gloo devices are made for 127.0.0.1); with an older torch "
        "that lacks the gloo creator winport replaces, set to `lo` in the ranks unless given (Linux).")
PYTHONUTF8 = EnvVar(
    "PYTHONUTF8", "bool", False, owner="Python", true=("1",), false=("0",),
    why="Set by `winport serve`: SGLang opens JSON files without encoding=, which on Windows means cp1252.")
LOCALAPPDATA = EnvVar(
    "LOCALAPPDATA", "path", None, owner="Windows", default_text="`~/AppData/Local`",
    why="Root of the default WINPORT_CACHE on Windows.")
XDG_CACHE_HOME = EnvVar(
    "XDG_CACHE_HOME", "path", None, owner="XDG", default_text="`~/.cache`",
    why="Root of the default WINPORT_CACHE elsewhere.")
PROMETHEUS_MULTIPROC_DIR = EnvVar(
    "PROMETHEUS_MULTIPROC_DIR", "path", None, owner="prometheus_client", default_text="unset",
    why="Set by SGLang's --enable-metrics: when present, the hot-expert counters join /metrics "
        "(winport.hybrid.hot_metrics).")

_OWN = (
    WINPORT_EMULATE_WINDOWS, WINPORT_PLATFORM, WINPORT_SHIMS, WINPORT_CACHE, WINPORT_READY_TIMEOUT,
    WINPORT_CUDA_GRAPH, WINPORT_GPU_MXFP4_MOE, WINPORT_CPU_TORCH_KERNELS, WINPORT_ENGRAM_GGUF, WINPORT_KT_MOE,
    WINPORT_HOT_EXPERTS, WINPORT_HOT_EXPERTS_INTERVAL, WINPORT_HOT_EXPERTS_DECAY,
    WINPORT_EXPERTS_RECORD, WINPORT_EXPERT_PLACEMENT,
    WINPORT_GGUF_THREADS, WINPORT_GGUF_KEEP_PAGE_CACHE, WINPORT_GGUF_REPACK_CHUNK, WINPORT_GGUF_DEQUANT_CHUNK,
)
_TEST_VARS = (
    WINPORT_RECORD_TRITON, WINPORT_TRITON_COMPILE_PROCS, WINPORT_TEST_SERVER_LOG_DIR, WINPORT_VISION_CAPTURE_DIR,
    WINPORT_WINE_DIR, WINPORT_WINE_PROGRESS, WINPORT_WINE_RESUME_FROM, WINPORT_JIT_PROBE_FILE, WINPORT_REPO,
)
_FOREIGN = (
    SGLANG_USE_CPU_ENGINE, SGLANG_CRASH_ON_JIT_COMPILE, SGLANG_OPT_USE_FUSED_HASH_TOPK, SGLANG_ENABLE_JIT_DEEPGEMM,
    SGLANG_IS_FLASHINFER_AVAILABLE, SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK, SGLANG_DSV4_FP4_DEQUANT,
    SGLANG_FP8_PAGED_MQA_LOGITS_TORCH, SGLANG_OPT_FP8_WO_A_GEMM, SGLANG_CPU_OMP_THREADS_BIND,
    SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, KT_KERNEL_CPU_VARIANT,
    KT_FORCE_SYNC_SUBMIT, KT_KERNEL_DEBUG, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, PYTHONUTF8, LOCALAPPDATA,
    XDG_CACHE_HOME, PROMETHEUS_MULTIPROC_DIR,
)


def _table(*groups: tuple[EnvVar, ...]) -> dict[str, EnvVar]:
    out: dict[str, EnvVar] = {}
    for var in (v for group in groups for v in group):
        if var.name in out:
            raise ValueError(f"{var.name} is declared twice")
        out[var.name] = var
    return out


# The one table: winport's variables, the kernels' (kernels_triton._env), the tests', then foreign ones.
VARIABLES: dict[str, EnvVar] = _table(_OWN, KERNEL_VARIABLES, _TEST_VARS, _FOREIGN)


def _default_text(var: EnvVar) -> str:
    if var.default_text is not None:
        return var.default_text
    if var.default is None:
        return "unset"
    if var.type == "bool":
        return f"`{var.true[0] if var.default else var.false[0]}`"
    return f"`{var.default}`"


def _type_text(var: EnvVar) -> str:
    if var.type == "choice":
        return " \\| ".join(var.choices)
    return var.type


def markdown_table() -> str:
    """The README's table of environment variables (the text between its envs markers)."""
    rows = ["| Variable | Type | Default | Owner | Why |", "|---|---|---|---|---|"]
    for var in VARIABLES.values():
        why = var.why.replace("|", "\\|")
        rows.append(f"| `{var.name}` | {_type_text(var)} | {_default_text(var)} | {var.owner} | {why} |")
    bools = (f"Booleans: `{'`/`'.join(TRUE_SPELLINGS)}` and `{'`/`'.join(FALSE_SPELLINGS)}`, any case; "
             "another program's boolean takes only the spellings that program reads the same way. "
             "An empty value counts as unset. Generated by `python -m winport envs --markdown`.")
    return "\n".join([*rows, "", bools])


def main(argv: list[str] | None = None) -> int:
    """`winport envs [--markdown]`: the variables and their values in this process, or the README's table.

    (Not `python -m winport.envs`: the venv's interpreter-start bootstrap has imported this module already.)
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["--markdown"], ["--md"]):
        print(markdown_table())
        return 0
    if argv:
        print("usage: winport envs [--markdown]", file=sys.stderr)
        return 2
    width = max(map(len, VARIABLES))
    for var in VARIABLES.values():
        raw = var.raw()
        shown = "(unset)" if raw is None else repr(raw)
        print(f"{var.name:<{width}}  {shown}  [{var.owner}]")
    return 0
