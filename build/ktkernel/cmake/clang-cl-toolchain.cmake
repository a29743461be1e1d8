# Toolchain file: kt-kernel on Windows with LLVM's clang-cl + lld-link (MSVC ABI, needs the Visual
# Studio Build Tools' headers/libs in the environment, i.e. a "Developer PowerShell" or vcvars64).
# The variant's flags live in initial-cache.cmake; this file only picks the tools and links
# clang_rt.builtins, which clang-cl needs for __builtin_cpu_supports (kt-kernel/llamafile use it).
if(DEFINED KTWIN_LLVM_DIR)
  set(_hints "${KTWIN_LLVM_DIR}/bin")
endif()
find_program(KTWIN_CLANG_CL NAMES clang-cl HINTS ${_hints} REQUIRED)
find_program(KTWIN_LLD_LINK NAMES lld-link HINTS ${_hints} REQUIRED)
set(CMAKE_C_COMPILER "${KTWIN_CLANG_CL}")
set(CMAKE_CXX_COMPILER "${KTWIN_CLANG_CL}")
set(CMAKE_LINKER "${KTWIN_LLD_LINK}")

# Asked from the compiler itself: <resource>/lib/x86_64-pc-windows-msvc/clang_rt.builtins.lib
# (per-target layout) or, in older layouts, <resource>/lib/windows/clang_rt.builtins-x86_64.lib.
execute_process(
  COMMAND "${KTWIN_CLANG_CL}" /clang:--rtlib=compiler-rt /clang:-print-libgcc-file-name
  OUTPUT_VARIABLE KTWIN_CLANG_RT_BUILTINS
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT EXISTS "${KTWIN_CLANG_RT_BUILTINS}")
  execute_process(COMMAND "${KTWIN_CLANG_CL}" /clang:-print-resource-dir
                  OUTPUT_VARIABLE _res OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(KTWIN_CLANG_RT_BUILTINS "${_res}/lib/windows/clang_rt.builtins-x86_64.lib")
endif()
if(KTWIN_CLANG_RT_BUILTINS AND EXISTS "${KTWIN_CLANG_RT_BUILTINS}")
  foreach(_kind EXE SHARED MODULE)
    set(CMAKE_${_kind}_LINKER_FLAGS_INIT "\"${KTWIN_CLANG_RT_BUILTINS}\"")
  endforeach()
else()
  message(WARNING "clang_rt.builtins not found (${KTWIN_CLANG_RT_BUILTINS}): __builtin_cpu_supports will not link")
endif()
