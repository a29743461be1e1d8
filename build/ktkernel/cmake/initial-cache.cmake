# CMake initial cache for kt-kernel 0.7.2 on Windows with clang-cl (used by make.py; by hand:
#   cmake -G Ninja -DKTWIN_VARIANT=avx512_bf16 -DKTWIN_COMPAT_LIB=<ktwin_compat.lib>
#         -DKTWIN_LLVM_DIR=<LLVM> -C build/ktkernel/cmake/initial-cache.cmake
#         -DCMAKE_TOOLCHAIN_FILE=build/ktkernel/cmake/clang-cl-toolchain.cmake -S <kt-kernel> -B <dir>
# -D values must come BEFORE -C so that this script sees them).
#
# Why each entry exists:
#  - kt-kernel's `if(MSVC)` branch only adds /arch:AVX512 plus __AVX512*__ macros, and clang-cl
#    then refuses `_mm512_dpbf16_ps` etc. (the macro is defined, the target feature is not). So
#    every LLAMA_* ISA option is OFF (kt-kernel's and the vendored llama.cpp's MSVC branches add
#    nothing) and the real -m flags of the variant go into CMAKE_C/CXX_FLAGS instead.
#  - clang-cl ignores kt-kernel's `-O3` and `-ffast-math` ("unused"/"unknown argument"): Release
#    gives /O2, and fast-math must be spelled /clang:-ffast-math.
#  - KTRANSFORMERS_USE_CUDA=ON: a CPU-only build drops submit_with_cuda_stream, which SGLang calls.
#  - The compat layer: /FI ktwin_compat.h + stand-in headers for every C++ TU; its library is also
#    NUMA_LIBRARY, which kt-kernel's CMake requires (find_library(numa) or FATAL_ERROR).
if(NOT DEFINED KTWIN_VARIANT)
  set(KTWIN_VARIANT avx2)
endif()
set(KTWIN_VARIANT "${KTWIN_VARIANT}" CACHE STRING "kt-kernel CPU variant being built")

get_filename_component(_ktwin_compat "${CMAKE_CURRENT_LIST_DIR}/../compat" ABSOLUTE)

# Real ISA flags per variant (the same ladder as kt-kernel's setup.py variants).
set(_isa_avx2 "-mavx2 -mfma -mf16c")
set(_isa_avx512_base "${_isa_avx2} -mavx512f -mavx512bw -mavx512dq -mavx512vl")
set(_isa_avx512_vnni "${_isa_avx512_base} -mavx512vnni")
set(_isa_avx512_vbmi "${_isa_avx512_vnni} -mavx512vbmi")
set(_isa_avx512_bf16 "${_isa_avx512_vbmi} -mavx512bf16")
set(_isa_amx "${_isa_avx512_bf16} -mamx-tile -mamx-bf16 -mamx-int8")
if(NOT DEFINED _isa_${KTWIN_VARIANT})
  message(FATAL_ERROR "KTWIN_VARIANT=${KTWIN_VARIANT}: expected avx2, avx512_base, avx512_vnni, avx512_vbmi, avx512_bf16 or amx")
endif()
set(_isa "${_isa_${KTWIN_VARIANT}}")

set(CMAKE_BUILD_TYPE Release CACHE STRING "clang-cl ignores kt-kernel's -O3; Release gives /O2")

# llama.cpp / kt-kernel ISA options: all OFF, flags come from CMAKE_<LANG>_FLAGS below.
foreach(_opt LLAMA_NATIVE LLAMA_AVX LLAMA_AVX2 LLAMA_FMA LLAMA_F16C LLAMA_AVX512 LLAMA_AVX512_VBMI
             LLAMA_AVX512_VNNI LLAMA_AVX512_BF16 LLAMA_AVX512_FANCY_SIMD)
  set(${_opt} OFF CACHE BOOL "off for clang-cl: real -m flags are in CMAKE_<LANG>_FLAGS (winport)")
endforeach()

if(KTWIN_VARIANT STREQUAL "avx2")
  set(KTRANSFORMERS_CPU_USE_AMX_AVX512 OFF CACHE BOOL "")
else()
  set(KTRANSFORMERS_CPU_USE_AMX_AVX512 ON CACHE BOOL "")
endif()
if(KTWIN_VARIANT STREQUAL "amx")
  set(KTRANSFORMERS_CPU_USE_AMX ON CACHE BOOL "")
else()
  set(KTRANSFORMERS_CPU_USE_AMX OFF CACHE BOOL "")
endif()

set(KTRANSFORMERS_USE_CUDA ON CACHE BOOL "CUDA runtime on: submit_with_cuda_stream must exist")
set(KTRANSFORMERS_CUDA_STATIC_RUNTIME ON CACHE BOOL "")

set(_common "/DWIN32 /D_WINDOWS /EHsc /clang:-ffast-math -D_WIN32_WINNT=0x0A00 -DNOMINMAX ${_isa}")
set(CMAKE_C_FLAGS "${_common}" CACHE STRING "winport: clang-cl flags for ${KTWIN_VARIANT}")
string(STRIP
    "${_common} /Zc:__cplusplus /FI\"${_ktwin_compat}/ktwin_compat.h\" /I\"${_ktwin_compat}/include\" /I\"${_ktwin_compat}/include-msvc\" /I\"${_ktwin_compat}\" ${KTWIN_EXTRA_CXX_FLAGS}"
    _cxx)
set(CMAKE_CXX_FLAGS "${_cxx}" CACHE STRING "winport: clang-cl flags for ${KTWIN_VARIANT}")

if(DEFINED KTWIN_COMPAT_LIB)
  set(NUMA_LIBRARY "${KTWIN_COMPAT_LIB}" CACHE FILEPATH "winport compat layer stands in for libnuma")
endif()

# LLVM's OpenMP runtime (libomp.lib / libomp.dll ship with the LLVM Windows installer).
if(DEFINED KTWIN_LLVM_DIR)
  foreach(_lang C CXX)
    set(OpenMP_${_lang}_FLAGS "-Xclang -fopenmp" CACHE STRING "")
    set(OpenMP_${_lang}_LIB_NAMES "libomp" CACHE STRING "")
  endforeach()
  set(OpenMP_libomp_LIBRARY "${KTWIN_LLVM_DIR}/lib/libomp.lib" CACHE FILEPATH "")
endif()

# kt-kernel's configure installs git hooks with `sh` when it finds a git work tree; point its
# GIT_BIN at cmake itself so `rev-parse` fails and the step is skipped (no sh on plain Windows).
set(GIT_BIN "${CMAKE_COMMAND}" CACHE FILEPATH "winport: skip kt-kernel's git-hook installation")
