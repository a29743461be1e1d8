"""Pure PyTorch/Triton stand-ins for the Linux-only kernel libraries SGLang imports.

Each subpackage has the upstream import name (`shims.sgl_kernel` is what `import sgl_kernel`
resolves to through winport's shim finder) and exposes only the functions it really implements:
asking for anything else raises an error naming the upstream function (see shims._missing).
Nothing here imports `winport`.
"""
