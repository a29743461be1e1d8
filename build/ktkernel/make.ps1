# Thin wrapper: builds kt-kernel for Windows with build/ktkernel/make.py (all logic is there).
# Run from a "Developer PowerShell for VS" (x64), inside the project's venv, e.g.
#   .\build\ktkernel\make.ps1 --source C:\src\ktransformers --hwloc C:\deps\hwloc --fmt C:\deps\fmt
$ErrorActionPreference = "Stop"
$python = "python"
if ($env:VIRTUAL_ENV) {
    $python = Join-Path $env:VIRTUAL_ENV "Scripts\python.exe"
}
$script = Join-Path $PSScriptRoot "make.py"
& $python $script @args
exit $LASTEXITCODE
