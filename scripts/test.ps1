<#
.SYNOPSIS
Runs the port's test suite on Windows (every tier but gpu, slow and wine).

.DESCRIPTION
The Windows twin of scripts/test.sh: makes sure .venv has the test tools (scripts\install.ps1
-Dev), then runs pytest in it. The wine tier is left out because it emulates this very system
on Linux. Extra arguments go to pytest. pytest's "no tests collected" (exit code 5) counts as a
failure.

.PARAMETER Marker
pytest marker expression; default: 'not gpu and not slow and not wine'. Use 'gpu' on a machine
with an NVIDIA GPU.

.PARAMETER SkipInstall
Do not run scripts\install.ps1 -Dev first.

.PARAMETER PytestArgs
Further arguments for pytest, e.g. tests\ops -x.

.EXAMPLE
.\scripts\test.ps1

.EXAMPLE
.\scripts\test.ps1 -Marker gpu tests\ops
#>
[CmdletBinding()]
param(
    [string]$Marker = 'not gpu and not slow and not wine',
    [switch]$SkipInstall,
    [Parameter(ValueFromRemainingArguments = $true)]
    [string[]]$PytestArgs
)

Set-StrictMode -Version 3.0
$ErrorActionPreference = 'Stop'

$repo = Split-Path -Parent $PSScriptRoot
if (-not $SkipInstall) {
    & (Join-Path $PSScriptRoot 'install.ps1') -Dev
    if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
}
$python = Join-Path $repo '.venv\Scripts\python.exe'
if (-not (Test-Path -LiteralPath $python)) {
    [Console]::Error.WriteLine("test.ps1: $python not found; run scripts\install.ps1 -Dev")
    exit 2
}
$rest = @()
if ($PytestArgs) { $rest = $PytestArgs }

Push-Location $repo
try {
    & $python -m pytest -m $Marker @rest
    $code = $LASTEXITCODE
}
finally {
    Pop-Location
}
if ($code -eq 5) {
    [Console]::Error.WriteLine('test.ps1: pytest collected no tests; that is a failure')
    exit 1
}
exit $code
