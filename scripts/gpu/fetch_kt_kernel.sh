#!/usr/bin/env bash
# Fill .ktdev/ (git-ignored via .git/info/exclude) with kt-kernel 0.7.2's cp312 package for the H200
# device machine, whose Python is 3.12 and which has no network. The wheel is about 100 MB, over the
# 64 MiB a run may carry, so its kt_kernel and kt_kernel.libs travel as one xz tarball (about 6 MB with
# every CPU variant: `amx` for the host, `avx512_bf16` for what a Zen 4 workstation would load);
# scripts/gpu/hybrid_check.sh unpacks it into /tmp/site there.
# Run from the repo root here; then `run` with carry [".ktdev", ".whlserve"].
set -eu
mkdir -p .ktdev
grep -qx '/.ktdev/' .git/info/exclude || echo '/.ktdev/' >> .git/info/exclude
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 -d "$tmp" kt-kernel==0.7.2
(cd "$tmp" && python3 -m zipfile -e kt_kernel-*.whl x && tar -C x -cf - kt_kernel kt_kernel.libs) | xz -6 -T0 > .ktdev/kt_kernel.tar.xz
rm -rf "$tmp"
ls -la .ktdev
