<#
.SYNOPSIS
Installs the Windows port of SGLang for DeepSeek-V4.x into .venv (checks the machine first).

.DESCRIPTION
Checks the prerequisites, then creates .venv in the repository and runs the same Python installer
as scripts/install.sh (`python -m winport install`), which installs torch (CUDA build from the
PyTorch index), triton-windows, the locked dependencies (requirements\windows.lock), SGLang and
this port, and writes the shim loader.

Prerequisites checked, all reported at once before anything changes:
  - Windows 10 or 11, x64
  - Python 3.10-3.13, 64-bit, from python.org (3.12 preferred: the lock is resolved for it).
    The embeddable zip and the Microsoft Store build are refused: triton-windows compiles its
    launcher against Python's include\ and libs\ folders, which only the full installer has.
  - an NVIDIA driver (nvidia-smi)
  - the Microsoft Visual C++ 2015-2022 redistributable, x64 (registry)
  - long paths enabled (registry): some installed files exceed 260 characters

Safe to run again: an existing .venv is reused and each install step skips what is done.
With -WhatIf the checks run and the installer only prints what it would do (--dry-run).

.PARAMETER Python
python.exe to use. Default: the py launcher's 3.12, 3.13, 3.11 or 3.10, else python.exe on PATH.

.PARAMETER Dev
Also install the test tools (pytest, ruff, ...), like install.sh --dev.

.PARAMETER KtSource
A ktransformers checkout at tag v0.7.2 (or its kt-kernel folder): kt-kernel is built from it with
clang-cl (build\ktkernel\make.py, see build\README.md). Without it the CPU experts use the torch path.

.PARAMETER SkipGpuCheck
Continue without an NVIDIA driver (the demo model runs on the CPU); the check becomes a warning.

.EXAMPLE
.\scripts\install.ps1
Checks the machine, then installs into .venv.

.EXAMPLE
.\scripts\install.ps1 -WhatIf
Checks the machine and prints every install step without changing anything.

.EXAMPLE
.\scripts\install.ps1 -Python C:\Python312\python.exe -Dev

.NOTES
Exit codes: 0 done, 1 a prerequisite is missing (the messages say what to do), other values are
those of `python -m winport install`.
#>
[CmdletBinding(SupportsShouldProcess = $true)]
param(
    [string]$Python,
    [switch]$Dev,
    [string]$KtSource,
    [switch]$SkipGpuCheck
)

Set-StrictMode -Version 3.0
$ErrorActionPreference = 'Stop'

$repo = Split-Path -Parent $PSScriptRoot
$venv = Join-Path $repo '.venv'
$problems = New-Object System.Collections.Generic.List[string]

function Write-Check([string]$Name, [string]$Value) {
    Write-Host ('  ok  {0,-22} {1}' -f $Name, $Value)
}

function Add-Problem([string]$Name, [string]$Value, [string]$Advice) {
    Write-Host ('  !!  {0,-22} {1}' -f $Name, $Value) -ForegroundColor Red
    Write-Host "        -> $Advice"
    $problems.Add("${Name}: $Advice")
}

function Get-RegistryValue([string]$Path, [string]$Name) {
    # $null when the key or the value does not exist (StrictMode forbids reading absent properties).
    $item = Get-ItemProperty -LiteralPath $Path -Name $Name -ErrorAction SilentlyContinue
    if ($null -eq $item) { return $null }
    return $item.$Name
}

function Invoke-Quiet([string]$Exe, [string[]]$Arguments) {
    # stdout of a native program, stderr dropped; the exit code stays in $LASTEXITCODE.
    # Windows PowerShell 5.1 turns redirected stderr lines into errors, which 'Stop' would make fatal.
    $ErrorActionPreference = 'Continue'
    & $Exe @Arguments 2>$null
}

function Find-Python {
    if ($Python) { return $Python }
    $launcher = Get-Command 'py.exe' -ErrorAction SilentlyContinue
    if ($launcher) {
        foreach ($version in @('3.12', '3.13', '3.11', '3.10')) {
            $exe = Invoke-Quiet $launcher.Source @("-$version", '-c', 'import sys; print(sys.executable)')
            if ($LASTEXITCODE -eq 0 -and $exe) { return ([string]$exe).Trim() }
        }
    }
    # The Microsoft Store's python.exe aliases live in WindowsApps; they are refused below anyway.
    $onPath = Get-Command 'python.exe' -ErrorAction SilentlyContinue |
        Where-Object { $_.Source -notlike '*\WindowsApps\*' } | Select-Object -First 1
    if ($onPath) { return $onPath.Source }
    return $null
}

# Reads the facts about an interpreter; single quotes only, so Windows PowerShell 5.1 passes it intact.
$probe = @'
import json, os, struct, sys, sysconfig
v = sys.version_info
base = sys.base_prefix
home = os.path.dirname(sys.executable)
print(json.dumps({
    'version': '%d.%d.%d' % (v[0], v[1], v[2]),
    'minor': v[0] * 100 + v[1],
    'executable': sys.executable,
    'bits': struct.calcsize('P') * 8,
    'headers': os.path.isfile(os.path.join(base, 'include', 'Python.h')),
    'importlib': os.path.isfile(os.path.join(base, 'libs', 'python%d%d.lib' % (v[0], v[1]))),
    'embeddable': any(n.endswith('._pth') for n in os.listdir(home)),
    'store': 'WindowsApps' in sys.executable or 'WindowsApps' in base,
    'freethreaded': bool(sysconfig.get_config_var('Py_GIL_DISABLED')),
}))
'@

Write-Host 'install.ps1: checking prerequisites'

# 1. Windows 10/11 on x64 (kt-kernel and the CUDA wheels exist for x86-64 only).
$os = [System.Environment]::OSVersion
$arch = $env:PROCESSOR_ARCHITECTURE
if ($env:PROCESSOR_ARCHITEW6432) { $arch = $env:PROCESSOR_ARCHITEW6432 }
if ($os.Platform -ne 'Win32NT' -or $os.Version.Major -lt 10) {
    Add-Problem 'Windows' "$($os.VersionString)" 'Windows 10 or 11 is required (on Linux use scripts/install.sh)'
}
elseif ($arch -ne 'AMD64' -or -not [System.Environment]::Is64BitOperatingSystem) {
    Add-Problem 'Windows' "$($os.VersionString) on $arch" 'an x64 (AMD64) Windows is required'
}
else {
    $edition = if ($os.Version.Build -ge 22000) { 'Windows 11' } else { 'Windows 10' }
    Write-Check 'Windows' "$edition (build $($os.Version.Build), $arch)"
}

# 2. Python from python.org.
$pythonExe = Find-Python
$info = $null
if (-not $pythonExe) {
    Add-Problem 'Python' 'not found' 'install Python 3.12 (64-bit) from python.org, or pass -Python C:\path\python.exe'
}
else {
    $json = Invoke-Quiet $pythonExe @('-c', $probe)
    if ($LASTEXITCODE -ne 0 -or -not $json) {
        Add-Problem 'Python' "$pythonExe does not run" 'pass a working python.exe with -Python'
    }
    else {
        $info = ($json -join "`n") | ConvertFrom-Json
        $what = "$($info.version) ($($info.executable))"
        if ($info.minor -lt 310 -or $info.minor -gt 313) {
            Add-Problem 'Python' $what 'Python 3.10-3.13 is required (3.12 preferred)'
        }
        elseif ($info.bits -ne 64) {
            Add-Problem 'Python' "$what, $($info.bits)-bit" 'install the 64-bit Python from python.org'
        }
        elseif ($info.freethreaded) {
            Add-Problem 'Python' "$what, free-threaded" 'use the regular (GIL) build from python.org'
        }
        elseif ($info.embeddable -or $info.store -or -not $info.headers -or -not $info.importlib) {
            Add-Problem 'Python' "$what is an embeddable or Store build (no include\ or libs\)" 'install Python from python.org with its regular installer (triton-windows needs include\ and libs\)'
        }
        else {
            Write-Check 'Python' $what
        }
    }
}

# 3. NVIDIA driver.
$smi = Get-Command 'nvidia-smi.exe' -ErrorAction SilentlyContinue
$gpus = $null
if ($smi) {
    $gpus = Invoke-Quiet $smi.Source @('--query-gpu=name,driver_version,memory.total', '--format=csv,noheader')
    if ($LASTEXITCODE -ne 0) { $gpus = $null }
}
if ($gpus) {
    foreach ($gpu in @($gpus)) { Write-Check 'NVIDIA GPU' ([string]$gpu).Trim() }
}
elseif ($SkipGpuCheck) {
    Write-Warning 'no NVIDIA driver found (nvidia-smi); continuing because of -SkipGpuCheck: only the CPU path will work'
}
else {
    Add-Problem 'NVIDIA driver' 'nvidia-smi not found or failing' 'install the current NVIDIA driver, or pass -SkipGpuCheck to install for CPU only (the demo model)'
}

# 4. Visual C++ 2015-2022 redistributable (x64): torch and triton-windows load its DLLs.
$vcKey = 'HKLM:\SOFTWARE\Microsoft\VisualStudio\14.0\VC\Runtimes\x64'
$vcInstalled = Get-RegistryValue $vcKey 'Installed'
if ($null -eq $vcInstalled) {
    $vcKey = 'HKLM:\SOFTWARE\WOW6432Node\Microsoft\VisualStudio\14.0\VC\Runtimes\x64'
    $vcInstalled = Get-RegistryValue $vcKey 'Installed'
}
if ($vcInstalled -eq 1) {
    Write-Check 'VC++ redistributable' ([string](Get-RegistryValue $vcKey 'Version'))
}
else {
    Add-Problem 'VC++ redistributable' 'not installed' 'install the latest Microsoft Visual C++ 2015-2022 Redistributable (x64), vc_redist.x64.exe'
}

# 5. Long paths: without them pip fails on files deep inside site-packages.
$longPaths = Get-RegistryValue 'HKLM:\SYSTEM\CurrentControlSet\Control\FileSystem' 'LongPathsEnabled'
if ($longPaths -eq 1) {
    Write-Check 'long paths' 'enabled'
}
else {
    Add-Problem 'long paths' 'disabled' "as administrator: New-ItemProperty -Path 'HKLM:\SYSTEM\CurrentControlSet\Control\FileSystem' -Name LongPathsEnabled -Value 1 -PropertyType DWord -Force"
}

if ($problems.Count -gt 0) {
    [Console]::Error.WriteLine("install.ps1: $($problems.Count) prerequisite(s) missing; nothing was changed")
    exit 1
}

$installArgs = @('-m', 'winport', 'install')
if ($Dev) { $installArgs += '--dev' }
if ($KtSource) { $installArgs += @('--kt-source', $KtSource) }

Push-Location $repo
try {
    if ($WhatIfPreference) {
        # -WhatIf: the installer prints every step and command and changes nothing.
        Write-Host "What if: create $venv with $($info.executable) and run: python $($installArgs -join ' ') --dry-run"
        & $info.executable @installArgs '--dry-run'
        $code = $LASTEXITCODE
    }
    elseif ($PSCmdlet.ShouldProcess($venv, "install the port with Python $($info.version)")) {
        $venvPython = Join-Path $venv 'Scripts\python.exe'
        if (Test-Path -LiteralPath $venvPython) {
            Write-Host "install.ps1: reusing $venv"
        }
        else {
            Write-Host "install.ps1: creating $venv"
            & $info.executable -m venv $venv
            if ($LASTEXITCODE -ne 0) {
                [Console]::Error.WriteLine("install.ps1: creating $venv failed (exit code $LASTEXITCODE)")
                exit 1
            }
        }
        # The installer runs with the interpreter that made the venv; it installs into .venv.
        & $info.executable @installArgs
        $code = $LASTEXITCODE
        if ($code -eq 0) {
            Write-Host 'install.ps1: done. Next: .\scripts\serve.ps1 -Demo   (or -Model <gguf dir> -VramGib N)'
        }
        else {
            [Console]::Error.WriteLine("install.ps1: python -m winport install failed (exit code $code)")
        }
    }
    else {
        $code = 0  # declined at the -Confirm prompt
    }
}
finally {
    Pop-Location
}
exit $code
