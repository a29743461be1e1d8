/*
 * Test-harness stand-in for bcryptprimitives.dll, which Wine 8.0 does not ship.
 *
 * Why: extensions built with Rust >= 1.78 (tokenizers, orjson, pydantic-core, safetensors, ...)
 * import ProcessPrng from this DLL for their random numbers; without it the loader refuses them.
 * Real Windows 10/11 has the DLL, so this file lives in tests/ only and never ships.
 * ProcessPrng fills a buffer with random bytes and (per its contract) always succeeds;
 * here advapi32's RtlGenRandom (exported as SystemFunction036) produces the bytes.
 */
#include <windows.h>

typedef BOOLEAN (WINAPI *gen_random_fn)(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE out, SIZE_T size)
{
    static gen_random_fn gen;
    if (!gen) {
        HMODULE advapi = LoadLibraryA("advapi32.dll");
        gen = advapi ? (gen_random_fn)(void *)GetProcAddress(advapi, "SystemFunction036") : NULL;
        if (!gen) return FALSE;
    }
    while (size > 0) {
        /* RtlGenRandom takes a 32-bit length: feed it in chunks */
        ULONG chunk = size > 0x10000000u ? 0x10000000u : (ULONG)size;
        if (!gen(out, chunk)) return FALSE;
        out += chunk;
        size -= chunk;
    }
    return TRUE;
}
