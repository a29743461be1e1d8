<#
.SYNOPSIS
Serves a DeepSeek-V4.x model (or the tiny demo model) through SGLang's OpenAI-compatible API.

.DESCRIPTION
A thin wrapper over `winport serve` in the .venv that scripts\install.ps1 created: each parameter
maps onto one flag of `winport serve` (see $FlagOf below; `winport serve --help` documents them)
and nothing else happens here, so Windows and Linux run the same Python code.
Parameters left out are not passed, so the defaults are those of `winport serve`.

.PARAMETER Model
A GGUF file or shard, a folder of GGUF files, or a checkpoint folder (--model).

.PARAMETER Demo
Serve the tiny generated DeepSeek-V4 demo model instead of a real one; runs on the CPU when
there is no GPU (--demo).

.PARAMETER DemoVariant
Which demo model: v4, v41, or v41-vision (the V4.1 demo with a small vision tower) (--demo-variant).

.PARAMETER VramGib
Cap on the GPU memory the server takes, in GiB (--vram-gib).

.PARAMETER Port
TCP port to listen on; default 30000 (--port).

.PARAMETER BindAddress
Address to bind; default 127.0.0.1, i.e. this machine only (--host). Also accepted as -Host
(PowerShell reserves the variable name $Host, so the parameter itself cannot be called Host).

.PARAMETER ContextLength
Maximum context length in tokens (--context-length).

.PARAMETER Draft
DSpark draft-model GGUF; by default one found next to the model is used (--draft-model).

.PARAMETER SpeculativeAlgorithm
DSPARK: speculative decoding with the DSpark draft bundled in the model; CUDA only, refused on the
CPU (--speculative-algorithm).

.PARAMETER Mmproj
Vision projector GGUF; by default one found next to the model is used (--mmproj).

.PARAMETER CpuThreads
Sets OMP_NUM_THREADS (torch's CPU threads); default: left as it is (--cpu-threads).

.PARAMETER GpuExperts
Routed experts per layer kept on the GPU; the rest run in kt-kernel on the CPU; default: all on
the GPU (--gpu-experts).

.PARAMETER RecordExperts
Count how often each routed expert is chosen and write the counts to this file whenever the
server goes idle; needs kt-kernel's experts (--record-experts).

.PARAMETER ExpertPlacement
Start the GPU expert slots with the experts a route record counted most often (--expert-placement).

.PARAMETER ServedModelName
The model name clients send and see; default: the model folder's name (--served-model-name).

.PARAMETER MaxRunningRequests
How many requests run at once; more wait in a queue (--max-running-requests; default on CUDA 16, a
workstation's share, which the -VramGib plan prices the sliding-window KV pool for).

.PARAMETER ApiKey
Require this key as 'Authorization: Bearer <key>' (--api-key).

.PARAMETER Device
auto, cpu or cuda (--device).

.PARAMETER Tp
Tensor-parallel size (--tp).

.PARAMETER LogLevel
debug, info, warning or error (--log-level).

.EXAMPLE
.\scripts\serve.ps1 -Model D:\models\DeepSeek-V4.1-Flash-GGUF -VramGib 24
Serves the GGUF model on 127.0.0.1:30000 with at most 24 GiB of GPU memory.

.EXAMPLE
.\scripts\serve.ps1 -Demo -Port 8000
Serves the tiny demo model; try it with
Invoke-RestMethod http://127.0.0.1:8000/v1/models

.NOTES
Run scripts\install.ps1 first. The exit code is that of `winport serve`.
#>
[CmdletBinding(DefaultParameterSetName = 'Model')]
param(
    [Parameter(Mandatory = $true, ParameterSetName = 'Model', Position = 0)]
    [string]$Model,

    [Parameter(Mandatory = $true, ParameterSetName = 'Demo')]
    [switch]$Demo,

    [Parameter(ParameterSetName = 'Demo')]
    [ValidateSet('v4', 'v41', 'v41-vision')]
    [string]$DemoVariant,

    [double]$VramGib,

    [ValidateRange(1, 65535)]
    [int]$Port,

    [Alias('Host')]
    [string]$BindAddress,

    [int]$ContextLength,

    [string]$Draft,

    [ValidateSet('DSPARK')]
    [string]$SpeculativeAlgorithm,

    [string]$Mmproj,

    [int]$CpuThreads,

    [ValidateRange(0, 2147483647)]
    [int]$GpuExperts,

    [int]$MaxRunningRequests,

    [string]$RecordExperts,

    [string]$ExpertPlacement,

    [string]$ServedModelName,

    [string]$ApiKey,

    [ValidateSet('auto', 'cpu', 'cuda')]
    [string]$Device,

    [int]$Tp,

    [ValidateSet('debug', 'info', 'warning', 'error')]
    [string]$LogLevel
)

Set-StrictMode -Version 3.0
$ErrorActionPreference = 'Stop'

# Parameter -> flag of `winport serve` (winport/serve/args.py). tests/windows checks this table
# against the parser in both directions, so a flag added there cannot be forgotten here.
$FlagOf = [ordered]@{
    Model         = '--model'
    Demo          = '--demo'
    DemoVariant   = '--demo-variant'
    VramGib       = '--vram-gib'
    Port          = '--port'
    BindAddress   = '--host'
    ContextLength = '--context-length'
    Draft         = '--draft-model'
    SpeculativeAlgorithm = '--speculative-algorithm'
    Mmproj        = '--mmproj'
    CpuThreads    = '--cpu-threads'
    GpuExperts    = '--gpu-experts'
    MaxRunningRequests = '--max-running-requests'
    RecordExperts = '--record-experts'
    ExpertPlacement = '--expert-placement'
    ServedModelName = '--served-model-name'
    ApiKey        = '--api-key'
    Device        = '--device'
    Tp            = '--tp'
    LogLevel      = '--log-level'
}

$repo = Split-Path -Parent $PSScriptRoot
$python = Join-Path $repo '.venv\Scripts\python.exe'
if (-not (Test-Path -LiteralPath $python)) {
    [Console]::Error.WriteLine("serve.ps1: $python not found; run scripts\install.ps1 first")
    exit 2
}

$argv = @('-m', 'winport', 'serve')
foreach ($name in $FlagOf.Keys) {
    if (-not $PSBoundParameters.ContainsKey($name)) { continue }
    $value = $PSBoundParameters[$name]
    if ($value -is [System.Management.Automation.SwitchParameter]) {
        if ($value.IsPresent) { $argv += $FlagOf[$name] }
    }
    else {
        # PowerShell converts numbers to text with the invariant culture ("2.5", never "2,5").
        $argv += $FlagOf[$name]
        $argv += [string]$value
    }
}

Write-Verbose ("running: $python " + ($argv -join ' '))
Push-Location $repo
try {
    & $python @argv
    $code = $LASTEXITCODE
}
finally {
    Pop-Location
}
exit $code
