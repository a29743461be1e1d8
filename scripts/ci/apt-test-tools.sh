#!/usr/bin/env bash
# Installs the Debian tools the build tier (tests/build) needs: clang-19 (clang, clang-cl, lld-link),
# mingw-w64 headers + the posix-threads libstdc++ (the x86_64-w64-windows-gnu stand-in for a
# clang-cl build), and wine64 to run the cross-built checks.
# Idempotent; run as root. Prints what it installs, or that nothing was missing.
set -euo pipefail

PKGS=(
  clang-19                      # clang, clang++ and clang-cl drivers
  lld-19                        # ld.lld / lld-link for the Windows link
  g++-mingw-w64-x86-64-posix    # libstdc++ with std::thread (posix threads) for mingw
  mingw-w64-x86-64-dev          # Windows headers + CRT import libs for x86_64-w64-mingw32
  wine64                        # runs the cross-built .exe checks
  libnuma-dev                   # native build of the POSIX-surface check against real libnuma
  gcc-mingw-w64-x86-64-posix    # wine tier: x86_64-w64-mingw32-gcc builds the harness's bcryptprimitives stub
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "apt-test-tools: all present: ${PKGS[*]}"
  exit 0
fi

echo "apt-test-tools: installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${missing[@]}"
echo "apt-test-tools: installed: ${missing[*]}"
