#!/usr/bin/env bash
# Fill .whlserve/ (git-ignored via .git/info/exclude) with what scripts/gpu/serve_demo.sh installs on
# the H200 device machine, which has torch/triton/transformers-5.17 but no SGLang, no server
# dependencies and no network: the repacked SGLang wheel from this machine's installer cache plus
# the cp312 manylinux wheels of every package the device image lacks (the list was found by
# comparing the venv's `pip list` with the device image's package list, then by running there).
# Run from the repo root here; then `run` with carry [".whlserve"].
set -eu
mkdir -p .whlserve
grep -qx '/.whlserve/' .git/info/exclude || echo '/.whlserve/' >> .git/info/exclude
cp .cache/install/repacked/sglang-*-py3-none-any.whl .whlserve/
PKGS="annotated_types==0.8.0 apache_tvm_ffi==0.1.11 asttokens==3.0.2 blobfile==3.3.0 cffi==2.1.1
compressed_tensors==0.18.0 dill==0.4.1 executing==2.3.0 fastapi==0.165.0 gguf==0.19.0 httpcore2==2.16.2
httpx2==2.16.2 interegular==0.3.3 ipython==9.18.1 ipython_pygments_lexers==1.1.1 jedi==0.20.1 jiter==0.19.0
jsonschema==4.26.0 jsonschema_specifications==2025.9.1 loguru==0.7.3 matplotlib_inline==0.2.2 msgspec==0.23.0
openai==3.57.0 opentelemetry_api==1.45.2 orjson==3.13.0 parso==0.8.7 partial_json_parser==0.2.1.1.post7
pexpect==4.9.0 prompt_toolkit==3.0.53 ptyprocess==0.7.0 pure_eval==0.2.4 pybase64==1.5.1 pycparser==3.12
pycryptodomex==3.24.2 pydantic==2.14.4 pydantic_core==2.50.5 python_multipart==0.0.34 pyzmq==27.3.0
referencing==0.37.0 rpds_py==2026.9.1 setproctitle==1.3.8 sniffio==1.3.1 soundfile==0.14.0 stack_data==0.6.3
starlette==1.10.0 traitlets==5.16.1 transformers==5.23.0 truststore==0.10.5 typing_inspection==0.4.5
uvicorn==0.54.0 wcwidth==0.9.4 xgrammar==0.2.7"
PLAT=""
for p in manylinux1_x86_64 manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
  PLAT="$PLAT --platform $p"
done
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT \
  -d .whlserve $PKGS
du -sh .whlserve
