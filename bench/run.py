#!/usr/bin/env python3
"""Runs the benchmark suite and regenerates docs/benchmarks.md.

Every figure is a ratio against a baseline measured in the same run:
  * service: temb-server against temb-echo-server (the same gRPC stack
    answering with a cached zero tensor: the transport limit) and against
    bench/python_server.py (grpcio + numpy: what users would write instead),
    all three driven by the same `temb bench`;
  * CPU kernel: the engines against memset/memcpy of the same output size
    (Google Benchmark, one process) and against the same computation in
    numpy and, when installed, eager PyTorch, in this process.
Subjects and baselines are interleaved round by round, in a rotating order,
and each figure is the median over the rounds: on a shared machine the
throughput of a single run swings by 2-4x.

    bench/run.sh [--quick] [--gpu] [--build-dir=build-bench]
"""

import argparse
import collections
import contextlib
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
NOTES = Path(__file__).resolve().parent / "report_notes.md"
# Results measured by their own scripts (each file names its command,
# machine, commit and date), included in the report as they are.
MEASURED = Path(__file__).resolve().parent / "measured"
TARGETS = ["temb-server", "temb", "temb-echo-server", "temb_kernel_benchmark"]

COMMANDS = []  # every measuring command, for the report


def log(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr,
          flush=True)


def shown(cmd):
    """A command as the report shows it: relative to the repository."""
    words = ["python3" if str(c) == sys.executable else
             str(c).replace(str(REPO) + "/", "") for c in cmd]
    return " ".join(shlex.quote(w) for w in words)


def run(cmd, timeout, record=True, **kwargs):
    if record:
        COMMANDS.append(shown(cmd))
    return subprocess.run([str(c) for c in cmd], timeout=timeout, check=True,
                          stdout=subprocess.PIPE, text=True, **kwargs).stdout


# ---------------------------------------------------------------- building

def build(build_dir, cuda):
    # Configured every time, so that --gpu turns CUDA on in an existing
    # build directory.
    log(f"configuring {build_dir}")
    subprocess.run(
        ["cmake", "-S", REPO, "-B", build_dir, "-G", "Ninja",
         "-DCMAKE_BUILD_TYPE=Release",
         f"-DTEMB_ENABLE_CUDA={'ON' if cuda else 'OFF'}",
         f"-DTEMB_PYTHON={sys.executable}"],
        check=True, timeout=600, stdout=subprocess.DEVNULL)
    targets = TARGETS + (["temb_cuda_kernel_benchmark",
                          "temb_backend_benchmark"] if cuda else [])
    log(f"building {' '.join(targets)}")
    subprocess.run(["cmake", "--build", build_dir, "--target", *targets,
                    "-j", os.environ.get("JOBS", "2")], check=True,
                   timeout=3600)


# ---------------------------------------------------------------- machine

def machine():
    info = {"cores": os.cpu_count(), "model": platform.processor()}
    with contextlib.suppress(Exception):
        for line in subprocess.run(["lscpu"], stdout=subprocess.PIPE,
                                   text=True, timeout=10).stdout.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                info["model"] = value.strip()
            if key.strip() == "Flags":
                flags = set(value.split())
                info["isa"] = ", ".join(
                    f for f in ("avx2", "fma", "f16c", "avx512f") if f in flags)
    info["load"] = " ".join(f"{x:.1f}" for x in os.getloadavg())

    def git(*args):
        try:
            return subprocess.run(["git", "-C", REPO, *args],
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True,
                                  timeout=10).stdout.strip()
        except OSError:
            return ""
    # Binaries built elsewhere (scripts/gpu-bundle.sh) name the commit they
    # were built from; the copy they run in may have no .git, or a stale one.
    info["commit"] = os.environ.get("BENCH_COMMIT")
    if not info["commit"]:
        info["commit"] = git("rev-parse", "--short", "HEAD") or "unknown"
        if git("status", "--porcelain", "--untracked-files=no"):
            info["commit"] += " (with uncommitted changes)"
    info["date"] = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    with contextlib.suppress(Exception):
        info["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            stdout=subprocess.PIPE, text=True, timeout=20).stdout.strip()
    return info


# ---------------------------------------------------------------- servers

class Server:
    """A server process on 127.0.0.1 with an OS-picked port."""

    def __init__(self, name, cmd, workdir):
        self.name = name
        port_file = Path(workdir) / f"{name}.port"
        self.log_path = Path(workdir) / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [str(c) for c in cmd] + [f"--port_file={port_file}"],
            stdout=self._log, stderr=subprocess.STDOUT)
        COMMANDS.append(shown(cmd))
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not start:\n"
                                   f"{self.log_path.read_text()}")
            time.sleep(0.05)
        self.target = f"127.0.0.1:{port_file.read_text().strip()}"

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def temb_bench(bin_dir, target, batch, concurrency, seconds, dim=None,
               channels=1, dtype="fp32", mode="unary"):
    cmd = [bin_dir / "temb", "bench", f"--target={target}",
           f"--batch={batch}", f"--concurrency={concurrency}",
           f"--duration={seconds}s", f"--warmup={min(seconds, 1.0)}s",
           f"--channels={channels}", f"--dtype={dtype}", "--timeout=60s",
           "--json", "--allow_errors"]
    if mode != "unary":
        cmd.append(f"--mode={mode}")
    cmd += ([f"--dim={dim}", "--flip_sin_to_cos", "--downscale_freq_shift=0"]
            if dim else ["--preset=sdxl"])
    out = json.loads(run(cmd, timeout=seconds * 4 + 120, record=False))
    # Failed calls (a server shedding load) count as errors, not throughput.
    out["ok_rps"] = out["ok"] / out["duration_s"] if out["duration_s"] else 0
    out["failed"] = sum(out["errors"].values())
    return out


def rounds_over(servers, rounds, measure):
    """measure(server) for every server, `rounds` times, rotating the order;
    returns {server name: [result per round]}."""
    results = {s.name: [] for s in servers}
    for r in range(rounds):
        order = servers[r % len(servers):] + servers[:r % len(servers)]
        for server in order:
            results[server.name].append(measure(server))
    return results


def median_of(runs, key):
    return statistics.median(key(r) for r in runs)


# ---------------------------------------------------------------- kernels

def kernel_benchmark(bin_dir, repetitions, filter_regex, min_time,
                     cpu_time=False):
    """G elements/s by benchmark name: medians of wall-clock time, or with
    `cpu_time` of the process's CPU time (one-thread rows only: it leaves
    out the time other processes hold the core)."""
    cmd = [bin_dir / "temb_kernel_benchmark",
           f"--benchmark_repetitions={repetitions}",
           "--benchmark_report_aggregates_only=true",
           f"--benchmark_min_time={min_time}",
           f"--benchmark_filter={filter_regex}", "--benchmark_format=json"]
    data = json.loads(run(cmd, timeout=3600))
    medians = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name", "median") == "median" and not b.get(
                "error_occurred"):
            name = b["run_name"].removesuffix("/real_time")
            rate = b["items_per_second"] / 1e9
            if cpu_time:
                rate *= b["real_time"] / b["cpu_time"]
            medians[name] = rate
    return medians


def numpy_embedding(t, dim):
    half = dim // 2
    exponent = (np.float32(-math.log(10000.0)) *
                np.arange(half, dtype=np.float32)) / np.float32(half)
    angles = t[:, None] * np.exp(exponent)[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1)


KERNEL_SHAPES = [(1, 320), (64, 320), (1024, 1280), (16384, 1280)]


def kernel_timesteps(batch):
    """The timesteps temb_kernel_benchmark uses: spread over [0, 1000)."""
    return np.array([(n * 37) % 1000 for n in range(batch)], np.float32)


def torch_reference(torch):
    """diffusers' get_timestep_embedding with the benchmark's LDM spec (the
    real thing when diffusers is installed; else the same ops written out)."""
    try:
        from diffusers.models.embeddings import (  # pylint: disable=import-outside-toplevel
            get_timestep_embedding)
    except ImportError:
        return torch_embedding(torch)

    def get_timestep_embedding_ldm(t, dim):
        return get_timestep_embedding(t, dim, flip_sin_to_cos=False,
                                      downscale_freq_shift=1)
    return get_timestep_embedding_ldm


def torch_embedding(torch):
    def embed(t, dim):
        half = dim // 2
        exponent = -math.log(10000.0) * torch.arange(
            half, dtype=torch.float32, device=t.device) / half
        angles = t[:, None].float() * torch.exp(exponent)[None, :]
        return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    return embed


def time_calls(fn, min_seconds, sync=None, clock=time.perf_counter):
    """Median seconds per call over batches of calls."""
    fn()
    samples = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_seconds or len(samples) < 5:
        t0 = clock()
        for _ in range(3):
            fn()
        if sync:
            sync()
        samples.append((clock() - t0) / 3)
    return statistics.median(samples)


def try_torch():
    try:
        import torch  # pylint: disable=import-outside-toplevel
        return torch
    except ImportError:
        return None


# ---------------------------------------------------------------- plotting

def plot_latency(path, concurrencies, latency):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, style in (("temb-server", "-o"), ("echo", "--s"),
                        ("python", ":^")):
        for q, alpha in (("p50", 1.0), ("p99", 0.5)):
            axes[0].plot(concurrencies, [latency[name][c][q] for c in
                                         concurrencies], style, alpha=alpha,
                         label=f"{name} {q}")
        axes[1].plot(concurrencies, [latency[name][c]["rps"] for c in
                                     concurrencies], style, label=name)
    axes[0].set(xscale="log", yscale="log", xlabel="concurrency",
                ylabel="latency (us)",
                title="unary 1x320 fp32: latency percentiles")
    axes[1].set(xscale="log", xlabel="concurrency", ylabel="requests/s",
                title="unary 1x320 fp32: throughput")
    for ax in axes:
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_batches(path, batches, throughput):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, style in (("temb-server", "-o"), ("echo", "--s"),
                        ("python", ":^")):
        ax.plot(batches, [throughput[name][b] for b in batches], style,
                label=name)
    ax.set(xscale="log", yscale="log", xlabel="batch (timesteps per call)",
           ylabel="embeddings/s", title="unary Nx320 fp32, concurrency 8")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------- report

def fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def verdict(ok):
    return "**met**" if ok else "**not met**"


class Report:
    def __init__(self):
        self.lines = []

    def add(self, *lines):
        self.lines.extend(lines)

    def table(self, header, rows):
        self.add("| " + " | ".join(header) + " |",
                 "|" + "|".join("---" if i == 0 else "---:"
                                for i in range(len(header))) + "|")
        for row in rows:
            self.add("| " + " | ".join(str(c) for c in row) + " |")
        self.add("")

    def text(self):
        return "\n".join(self.lines).rstrip() + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer points, shorter runs (~4 minutes)")
    parser.add_argument("--gpu", action="store_true",
                        help="also run the CUDA parts (needs a GPU)")
    parser.add_argument("--build-dir", default=os.environ.get(
        "BUILD_DIR", "build-bench"))
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the report from the last run's "
                        "<build-dir>/bench_results.json")
    parser.add_argument("--output", default=str(DOC))
    args = parser.parse_args()

    build_dir = (REPO / args.build_dir).resolve()
    bin_dir = build_dir / "bin"
    results = build_dir / "bench_results.json"
    if args.report_only:
        report(int_keys(json.loads(results.read_text())), Path(args.output))
        return
    if not args.no_build:
        build(build_dir, args.gpu)
    info = machine()
    quick = args.quick
    rounds = 3 if quick else 5
    seconds = 1.5 if quick else 3.0
    concurrencies = [1, 8] if quick else [1, 2, 4, 8, 16]
    batches = [1, 32, 1024] if quick else [1, 8, 32, 128, 1024]
    started = time.monotonic()

    # ---- service
    with tempfile.TemporaryDirectory() as workdir:
        servers = []
        try:
            servers.append(Server("temb-server", [
                bin_dir / "temb-server", "--address=127.0.0.1:0",
                "--metrics_address=127.0.0.1:0", "--log_level=warn",
                "--backend=cpu"], workdir))
            servers.append(Server("echo", [
                bin_dir / "temb-echo-server", "--address=127.0.0.1:0"],
                workdir))
            servers.append(Server("python", [
                sys.executable, REPO / "bench" / "python_server.py",
                "--address=127.0.0.1:0", "--workers=8"], workdir))

            log("latency vs concurrency (1x320 fp32)")
            latency = {s.name: {} for s in servers}
            for c in concurrencies:
                res = rounds_over(servers, rounds, lambda s, c=c: temb_bench(
                    bin_dir, s.target, 1, c, seconds))
                for name, runs in res.items():
                    latency[name][c] = {
                        q: median_of(runs, lambda r, q=q: r["latency_us"][q])
                        for q in ("p50", "p90", "p99")}
                    latency[name][c]["rps"] = median_of(
                        runs, lambda r: r["ok_rps"])
                    latency[name][c]["failed"] = sum(r["failed"] for r in runs)

            log("throughput vs batch (Nx320 fp32, concurrency 8)")
            per_batch = {s.name: {} for s in servers}
            for b in batches:
                res = rounds_over(servers, rounds, lambda s, b=b: temb_bench(
                    bin_dir, s.target, b, 8, seconds))
                for name, runs in res.items():
                    per_batch[name][b] = median_of(
                        runs, lambda r: r["embeddings_per_s"])

            log("large responses (1280-wide fp32)")
            large = {s.name: {} for s in servers}
            large_batches = [1024] if quick else [1024, 4096]
            for b in large_batches:
                res = rounds_over(servers, rounds, lambda s, b=b: temb_bench(
                    bin_dir, s.target, b, 2, seconds, dim=1280, channels=2))
                for name, runs in res.items():
                    large[name][b] = median_of(
                        runs, lambda r: r["ok_rps"]) * b * 1280 * 4
            # The largest again over EmbedStream (the python server has
            # no stream).
            big = large_batches[-1]
            streaming = [s for s in servers if s.name != "python"]
            res = rounds_over(streaming, rounds, lambda s: temb_bench(
                bin_dir, s.target, big, 2, seconds, dim=1280, channels=2,
                mode="stream"))
            large_stream = {name: {big: median_of(
                runs, lambda r: r["ok_rps"]) * big * 1280 * 4}
                for name, runs in res.items()}
        finally:
            for s in servers:
                s.stop()

    # Representative invocations (the suite runs them with every target).
    COMMANDS.append(
        "temb bench --target=<server> --preset=sdxl --batch=N "
        f"--concurrency=C --duration={seconds}s --warmup=1s --channels=1 "
        "--dtype=fp32 --timeout=60s --json")
    COMMANDS.append(
        "temb bench --target=<server> --dim=1280 --flip_sin_to_cos "
        f"--downscale_freq_shift=0 --batch=N --concurrency=2 --channels=2 --duration={seconds}s "
        "--warmup=1s --dtype=fp32 --timeout=60s --json")

    # ---- kernels
    log("CPU kernels: all engines (Google Benchmark)")
    kernel_reps = 3
    kernels = kernel_benchmark(
        bin_dir, kernel_reps,
        "(Embed|Memset|Memcpy)/.*/(1x320|64x320|1024x1280|16384x1280)"
        "|SinCos/", 0.1 if quick else 0.3)

    log("CPU kernel fp32, one thread: engines vs numpy / PyTorch, "
        "interleaved")
    torch = try_torch()
    embed = torch_reference(torch) if torch is not None else None
    # The AVX2 engine where the CPU has it (the goals are set for it; an
    # AVX-512 engine is faster), else the widest one.
    engine_rounds = collections.defaultdict(list)  # (isa, shape) -> G/s
    numpy_rounds = []
    torch_rounds = collections.defaultdict(list)   # shape -> G/s
    shapes = "|".join(f"{b}x{d}" for b, d in KERNEL_SHAPES)
    for _ in range(rounds):
        res = kernel_benchmark(bin_dir, 1,
                               f"Embed/.*/fp32/({shapes})/threads:1/",
                               0.3, cpu_time=True)
        for name, g in res.items():
            engine_rounds[(name.split("/")[1], name.split("/")[3])].append(g)
        t_kernel = kernel_timesteps(1024)
        numpy_rounds.append(1024 * 1280 / time_calls(
            lambda: numpy_embedding(t_kernel, 1280), 0.3,
            clock=time.process_time) / 1e9)
        if torch is not None:
            torch.set_num_threads(1)
            for b, d in KERNEL_SHAPES:
                tt = torch.from_numpy(kernel_timesteps(b))
                torch_rounds[f"{b}x{d}"].append(b * d / time_calls(
                    lambda: embed(tt, d), 0.3, clock=time.process_time) / 1e9)
    engines = {f"{isa}/{shape}": statistics.median(v)
               for (isa, shape), v in engine_rounds.items()}
    subject = "avx2" if "avx2/1024x1280" in engines else max(
        (k.split("/")[0] for k in engines),
        key=["scalar", "sse2", "avx2", "avx512"].index)
    kernel_g = engines[f"{subject}/1024x1280"]
    numpy_g = statistics.median(numpy_rounds)
    torch_g = (statistics.median(torch_rounds["1024x1280"])
               if torch_rounds else None)
    kernel_vs_torch = {
        "subject": subject, "engines": engines,
        "torch": {k: statistics.median(v) for k, v in torch_rounds.items()},
        "torch_function": getattr(embed, "__qualname__", None)}

    gpu = run_gpu(bin_dir, torch, rounds, quick) if args.gpu else None

    m = dict(info=info, quick=quick, rounds=rounds, seconds=seconds,
             concurrencies=concurrencies, batches=batches, latency=latency,
             per_batch=per_batch, large=large, large_stream=large_stream,
             kernels=kernels, kernel_reps=kernel_reps, kernel_g=kernel_g, numpy_g=numpy_g,
             torch_g=torch_g, kernel_vs_torch=kernel_vs_torch,
             torch_version=torch.__version__ if torch else None,
             numpy_version=np.__version__, gpu=gpu,
             elapsed=time.monotonic() - started, commands=COMMANDS,
             command=shlex.join(["bench/run.sh", *sys.argv[1:]]))
    results.write_text(json.dumps(m, indent=1))
    report(m, Path(args.output))


def int_keys(value):
    """JSON turned int keys into strings; turns them back."""
    if isinstance(value, dict):
        return {int(k) if isinstance(k, str) and k.isdigit() else k:
                int_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [int_keys(v) for v in value]
    return value


def report(m, output):
    # docs/NAME.md keeps its plots in docs/NAME/.
    figures = output.with_suffix("")
    figures.mkdir(parents=True, exist_ok=True)
    plot_latency(figures / "latency_vs_concurrency.png", m["concurrencies"],
                 m["latency"])
    plot_batches(figures / "throughput_vs_batch.png", m["batches"],
                 m["per_batch"])
    if m["gpu"]:
        plot_gpu_service(figures / "gpu_service.png", m["gpu"]["service"])
    # Older results recorded absolute paths.
    COMMANDS[:] = [c.replace(str(REPO) + "/", "") for c in m["commands"]]
    write_report(output, m.get("command", "bench/run.sh" + (
        " --quick" if m["quick"] else "")), m["info"], m["quick"], m["rounds"], m["seconds"],
                 m["concurrencies"], m["batches"], m["latency"],
                 m["per_batch"], m["large"], m["kernels"], m["kernel_reps"],
                 m["kernel_g"], m["numpy_g"], m["torch_g"], m["torch_version"],
                 m["gpu"], m["elapsed"],
                 kernel_vs_torch=m.get("kernel_vs_torch"),
                 numpy_version=m.get("numpy_version", np.__version__),
                 large_stream=m.get("large_stream"))
    log(f"wrote {output}")


# ---------------------------------------------------------------- GPU

def run_gpu(bin_dir, torch, rounds, quick):
    """The CUDA kernel against cudaMemset of the same output and against
    eager PyTorch on the same device, interleaved round by round; then
    Backend::Compute of the CPU and CUDA backends; then the service with each
    backend against the echo under many concurrent clients."""
    results = {"bandwidth": [], "batches": {}, "transfers": []}
    exe = bin_dir / "temb_cuda_kernel_benchmark"
    cuda_torch = torch is not None and torch.cuda.is_available()
    embed = torch_embedding(torch) if cuda_torch else None
    log("CUDA kernel vs cudaMemset and eager PyTorch")
    for _ in range(rounds):
        data = json.loads(run([exe], timeout=600))
        results["bandwidth"].append(data["large"])
        results["transfers"].append(data["transfers"])
        for row in data["batches"]:
            b = row["batch"]
            entry = results["batches"].setdefault(b, {"temb_us": [],
                                                      "torch_us": []})
            entry["temb_us"].append(row["kernel_us"])
            if embed is not None:
                entry["torch_us"].append(torch_cuda_us(torch, embed, b))
    log("Backend::Compute, CPU and CUDA backends")
    results["backends"] = json.loads(run(
        [bin_dir / "temb_backend_benchmark",
         f"--seconds={0.4 if quick else 1.0}"], timeout=1200))
    results["service"] = gpu_service(bin_dir, rounds, 1.0 if quick else 3.0)
    return results


def torch_cuda_us(torch, embed, batch, burst=200, reps=7):
    """Microseconds per eager call, timed exactly like the temb kernel: CUDA
    events around a burst of back-to-back calls, median of the bursts."""
    t = (torch.arange(batch, device="cuda", dtype=torch.float32) * 37) % 1000
    for _ in range(burst):
        embed(t, 320)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        start.record()
        for _ in range(burst):
            embed(t, 320)
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3 / burst)
    return statistics.median(samples)


GPU_CONCURRENCIES = [1, 16, 64]
GPU_SERVERS = ("temb-auto", "temb-cuda", "temb-cpu", "echo")
GPU_BATCHES = [1, 32, 256, 1024, 4096]


def gpu_service(bin_dir, rounds, seconds):
    """temb-server routing by size (--backend=auto), on the GPU alone and on
    the CPU alone, against the echo, many clients: 1x320 against
    concurrency, and Nx1280 at concurrency 16."""
    result = {"latency": {}, "batches": {}}
    with tempfile.TemporaryDirectory() as workdir:
        servers = []
        try:
            for backend in ("auto", "cuda", "cpu"):
                servers.append(Server(f"temb-{backend}", [
                    bin_dir / "temb-server", "--address=127.0.0.1:0",
                    "--metrics_address=127.0.0.1:0", "--log_level=warn",
                    f"--backend={backend}"], workdir))
            servers.append(Server("echo", [
                bin_dir / "temb-echo-server", "--address=127.0.0.1:0"],
                workdir))
            log("GPU service: 1x320 against concurrency")
            for c in GPU_CONCURRENCIES:
                res = rounds_over(servers, rounds, lambda s, c=c: temb_bench(
                    bin_dir, s.target, 1, c, seconds, channels=min(c, 8)))
                for name, runs in res.items():
                    entry = result["latency"].setdefault(name, {})
                    entry[c] = {q: median_of(runs, lambda r, q=q:
                                             r["latency_us"][q])
                                for q in ("p50", "p99")}
                    entry[c]["rps"] = median_of(runs, lambda r: r["ok_rps"])
                    entry[c]["failed"] = sum(r["failed"] for r in runs)
            log("GPU service: Nx1280 at concurrency 16")
            for b in GPU_BATCHES:
                res = rounds_over(servers, rounds, lambda s, b=b: temb_bench(
                    bin_dir, s.target, b, 16, seconds, dim=1280, channels=8))
                for name, runs in res.items():
                    result["batches"].setdefault(name, {})[b] = median_of(
                        runs, lambda r: r["embeddings_per_s"])
        finally:
            for s in servers:
                s.stop()
    return result


def plot_gpu_service(path, service):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"temb-auto": "-*", "temb-cuda": "-o", "temb-cpu": "-.d",
              "echo": "--s"}
    for name, style in styles.items():
        if name not in service["latency"]:
            continue
        lat = service["latency"][name]
        cs = sorted(lat)
        axes[0].plot(cs, [lat[c]["p50"] for c in cs], style, label=name)
        bat = service["batches"][name]
        bs = sorted(bat)
        axes[1].plot(bs, [bat[b] for b in bs], style, label=name)
    axes[0].set(xscale="log", yscale="log", xlabel="concurrency",
                ylabel="p50 latency (us)", title="unary 1x320 fp32")
    axes[1].set(xscale="log", yscale="log", xlabel="batch",
                ylabel="embeddings/s", title="unary Nx1280 fp32, concurrency 16")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def large_gpu_sizes(gpu):
    return list(dict.fromkeys(
        f"{x['bytes'] / 2**20:.0f} MiB {x['dtype']}"
        for x in gpu["bandwidth"][0]))


def large_gpu(gpu, size):
    """Median kernel and memset GB/s over the rounds for one output size."""
    same = [x for rnd in gpu["bandwidth"] for x in rnd
            if f"{x['bytes'] / 2**20:.0f} MiB {x['dtype']}" == size]
    return (statistics.median(x["kernel_gbs"] for x in same),
            statistics.median(x["memset_gbs"] for x in same))


def gpu_sections(r, gpu, path):
    r.add("## Kernels (CUDA)", "",
          "`temb_cuda_kernel_benchmark` (bench/cuda_kernel_benchmark.cc): the "
          "fused kernel alone, device memory in and out, next to "
          "`cudaMemsetAsync` of the same output in the same process (the "
          "device's write bandwidth). Small batches: CUDA events around 200 "
          "back-to-back launches; eager PyTorch (cos/sin/exp/cat, PyTorch's "
          "op order) is timed the same way, from this Python process.", "")
    rows = []
    for size in large_gpu_sizes(gpu):
        k, m = large_gpu(gpu, size)
        rows.append([size, f"{k:.0f}", f"{m:.0f}", f"{k / m:.2f}"])
    r.table(["output", "kernel GB/s", "memset GB/s", "kernel / memset"], rows)
    rows = []
    for b, e in sorted(gpu["batches"].items()):
        k = statistics.median(e["temb_us"])
        t = statistics.median(e["torch_us"]) if e["torch_us"] else None
        rows.append([b, f"{k:.2f}", fmt(t), fmt(t / k if t else None)])
    r.table(["batch (x320 fp32)", "temb kernel us", "PyTorch eager us",
             "speed-up"], rows)
    if gpu.get("transfers"):
        r.add("Device to host: every service response crosses it. GB/s of "
              "output into pageable memory (where a gRPC response lives), "
              "medians of the rounds: the copy alone into pinned memory (the "
              "limit), that plus the host copy on (a staging buffer), the "
              "copy straight into pageable memory, and pinning the "
              "destination around the copy.", "")
        rows = []
        for i, first in enumerate(gpu["transfers"][0]):
            same = [rnd[i] for rnd in gpu["transfers"]]
            rows.append([f"{first['bytes'] / 2**20:.0f} MiB"] + [
                f"{statistics.median(x[k] for x in same):.1f}" for k in
                ("d2h_pinned_gbs", "staged_gbs", "d2h_pageable_gbs",
                 "registered_gbs")])
        r.table(["output", "pinned GB/s", "pinned + memcpy GB/s",
                 "pageable GB/s", "register + copy GB/s"], rows)

    be = gpu["backends"]
    r.add("## Backends: the whole Backend::Compute call", "",
          "`temb_backend_benchmark` (bench/backend_benchmark.cc) times what the "
          "server calls, host memory in and out: on the GPU that includes the "
          "upload, the launch, the download and the synchronisation. One "
          "caller's latency in us, and throughput in M embeddings/s. Latency: "
          "one caller, median of 7 rounds. Throughput: "
          f"{be['rows'][0]['callers']} callers back to back. "
          + "; ".join(f"{k}: {v}" for k, v in be["backends"].items()) + ".",
          "")
    by = {}
    for row in be["rows"]:
        by.setdefault((row["batch"], row["dim"]), {})[row["backend"]] = row
    names = [n for n in ("cpu", "cuda", "cuda+lent")
             if any(n in x for x in by.values())]
    rows = []
    for (b, d), x in by.items():
        rows.append([f"{b}x{d}"] +
                    [fmt(x[n]["latency_us"] if n in x else None, 1)
                     for n in names] +
                    [fmt(x[n]["throughput_eps"] / 1e6 if n in x else None, 3)
                     for n in names])
    r.table(["shape (fp32)"] + [f"{n} us" for n in names] +
            [f"{n} M emb/s" for n in names], rows)
    if "cuda+lent" in names:
        r.add("`cuda+lent`: the output is computed into page-locked memory the "
              "CUDA backend lends (`Backend::AllocateOutput`), as the server "
              "does for the responses it sends; `cuda`: into ordinary memory, "
              "through the backend's staging buffer.", "")

    svc = gpu["service"]
    r.add("## Service on the GPU machine: many concurrent clients", "",
          f"![gpu service]({path.stem}/gpu_service.png)", "",
          "temb-server with `--backend=auto` (responses of 1 MiB and more "
          "on the GPU, smaller ones on the CPU), `--backend=cuda` (all on the "
          "GPU) and `--backend=cpu`, and the echo, driven by the same "
          "`temb bench` (up to 8 channels).", "")
    rows = []
    for c in sorted(svc["latency"]["echo"]):
        e = svc["latency"]["echo"][c]
        for name in GPU_SERVERS:
            if name not in svc["latency"]:
                continue
            x = svc["latency"][name][c]
            rows.append([c, name, f"{x['p50']:.0f}", f"{x['p99']:.0f}",
                         f"{x['rps']:.0f}", x["failed"],
                         f"{x['rps'] / e['rps']:.2f}"])
    r.table(["concurrency (1x320)", "server", "p50 us", "p99 us", "ok rps",
             "failed", "rps / echo"], rows)
    names = [n for n in GPU_SERVERS if n in svc["batches"]]
    rows = []
    for b in sorted(svc["batches"]["echo"]):
        x = {n: svc["batches"][n][b] for n in names}
        rows.append([f"{b}x1280"] + [f"{x[n]:.0f}" for n in names] +
                    [f"{x[n] / x['echo']:.2f}" for n in names if n != "echo"])
    r.table(["batch (concurrency 16)"] + [f"{n} emb/s" for n in names] +
            [f"{n} / echo" for n in names if n != "echo"], rows)


def kernel_sections(r, kernels, vs_torch, torch_version):
    """The CPU kernel against eager PyTorch at every shape, and the engines'
    sin/cos against SLEEF's."""
    if vs_torch and vs_torch["torch"]:
        engines = vs_torch["engines"]
        isas = sorted({k.split("/")[0] for k in engines},
                      key=["scalar", "sse2", "avx2", "avx512"].index)
        isas = [i for i in isas if i in ("avx2", "avx512")] or isas[-1:]
        reference = ("diffusers' `get_timestep_embedding` (flip_sin_to_cos="
                     "False, downscale_freq_shift=1)"
                     if "get_timestep_embedding" in str(
                         vs_torch.get("torch_function"))
                     else "the same ops written out (diffusers is not "
                     "installed)")
        r.add("## CPU kernel against eager PyTorch, one thread", "",
              f"fp32, LDM spec, the kernel table's timesteps; PyTorch "
              f"{torch_version} runs {reference} with "
              "`torch.set_num_threads(1)`, interleaved with the engines in "
              "each round; G output elements per CPU second, medians. Goal: "
              "at least 4x at every shape on one core.", "")
        rows = []
        for b, d in KERNEL_SHAPES:
            shape = f"{b}x{d}"
            t = vs_torch["torch"].get(shape)
            row = [shape, fmt(t, 3)]
            for isa in isas:
                g = engines.get(f"{isa}/{shape}")
                row += [fmt(g, 3), f"{g / t:.1f}x" if g and t else "n/a"]
            worst = min((engines.get(f"{i}/{shape}") or 0) / t for i in isas)
            row.append(verdict(worst >= 4))
            rows.append(row)
        header = ["shape", "PyTorch"]
        for isa in isas:
            header += [isa, f"{isa} / PyTorch"]
        r.table(header + [">= 4x"], rows)
    own = {k.split("/")[1]: v for k, v in kernels.items()
           if k.startswith("SinCos/")}
    if own:
        r.add("## CPU sin/cos against SLEEF", "",
              "`SinCos/*` of temb_kernel_benchmark: the engines' sin/cos "
              "(kernels/cpu/sincos_via_double.h on AVX2 and AVX-512, SLEEF's "
              "u10 on the others) and SLEEF's u10 sincosf called directly, on "
              "the 655360 angles of the LDM 1024x1280 embedding; G output "
              "elements/s (sin and cos count one each), medians.", "")
        rows = []
        for isa in ("scalar", "sse2", "avx2", "avx512"):
            if isa not in own:
                continue
            sleef = own.get(f"sleef-{isa}")
            rows.append([isa, fmt(own[isa], 3), fmt(sleef, 3),
                         f"{own[isa] / sleef:.2f}x" if sleef else
                         "(the engine is SLEEF)"])
        r.table(["engine", "engine sin/cos", "SLEEF u10 sincosf",
                 "engine / SLEEF"], rows)


def write_report(path, command, info, quick, rounds, seconds, concurrencies, batches,
                 latency, per_batch, large, kernels, kernel_reps, kernel_g,
                 numpy_g, torch_g, torch_version, gpu, elapsed,
                 kernel_vs_torch=None, large_stream=None,
                 numpy_version=np.__version__):
    r = Report()
    cmd = command
    r.add("# Benchmarks", "",
          "Generated by `bench/run.sh` (bench/run.py); do not edit by hand: "
          "the prose that is not measured lives in bench/report_notes.md.", "",
          f"- Machine: {info['model']}, {info['cores']} logical cores "
          f"({info.get('isa', '')}); load average at the start "
          f"{info['load']}. Client and servers share these cores.",
          f"- GPU: {info.get('gpu') or 'none'}.",
          f"- Commit: {info['commit']}; date: {info['date']}; "
          f"command: `{cmd}` ({elapsed / 60:.1f} minutes).",
          "- Kernel target rows: elements per CPU second of the one "
          "thread (Google Benchmark's cpu_time; numpy/PyTorch timed with "
          "the process CPU clock), median of the rounds, so that time "
          "another process holds the core does not count.",
          f"- Method: each service figure is the median of {rounds} rounds; "
          f"in each round the subject and its baselines run one after the "
          f"other ({seconds:g} s measured after a warm-up, rotating order). "
          "Ratios compare numbers from the same rounds.", "")

    # Targets.
    echo, temb, py = latency["echo"], latency["temb-server"], latency["python"]
    p50_ratio = temb[1]["p50"] / echo[1]["p50"]
    c8 = 8 if 8 in concurrencies else concurrencies[-1]
    rps_ratio = temb[c8]["rps"] / echo[c8]["rps"]
    b32 = 32 if 32 in batches else batches[len(batches) // 2]
    py_ratio = per_batch["temb-server"][b32] / per_batch["python"][b32]
    big = max(large["echo"])
    bytes_ratio = large["temb-server"][big] / large["echo"][big]
    r.add("## Targets", "")
    if gpu:
        r.add("The service and CPU kernel targets are set for the 2-core "
              "machine (docs/benchmarks.md has that run); on this machine "
              "they are shown for orientation.  The CUDA rows are this "
              "machine's.", "")
    rows = [
        ["unary 1x320 fp32, p50 latency, concurrency 1",
         f"{temb[1]['p50']:.0f} us", f"echo {echo[1]['p50']:.0f} us",
         f"{p50_ratio:.2f}x", "<= 1.2x", verdict(p50_ratio <= 1.2)],
        [f"unary 1x320 fp32, throughput, concurrency {c8}",
         f"{temb[c8]['rps']:.0f} rps", f"echo {echo[c8]['rps']:.0f} rps",
         f"{rps_ratio:.2f}x", ">= 0.9x", verdict(rps_ratio >= 0.9)],
        [f"unary {b32}x320 fp32, throughput, concurrency 8",
         f"{per_batch['temb-server'][b32]:.0f} emb/s",
         f"python {per_batch['python'][b32]:.0f} emb/s",
         f"{py_ratio:.2f}x", ">= 3x", verdict(py_ratio >= 3)],
        [f"{big}x1280 fp32 responses ({big * 1280 * 4 / 2**20:.0f} MiB), "
         "concurrency 2",
         f"{large['temb-server'][big] / 2**20:.0f} MiB/s",
         f"echo {large['echo'][big] / 2**20:.0f} MiB/s",
         f"{bytes_ratio:.2f}x", ">= 0.8x", verdict(bytes_ratio >= 0.8)],
    ]
    if large_stream:
        sb = max(large_stream["echo"])
        stream_ratio = large_stream["temb-server"][sb] / large_stream["echo"][sb]
        rows.append(
            [f"{sb}x1280 fp32 responses ({sb * 1280 * 4 / 2**20:.0f} MiB) "
             "over EmbedStream, concurrency 2",
             f"{large_stream['temb-server'][sb] / 2**20:.0f} MiB/s",
             f"echo {large_stream['echo'][sb] / 2**20:.0f} MiB/s",
             f"{stream_ratio:.2f}x", ">= 0.8x", verdict(stream_ratio >= 0.8)])
    rows += [
        ["CPU kernel 1024x1280 fp32, AVX2 engine, one thread (per CPU second)",
         f"{kernel_g:.3f} G elem/s", "1.2 G elem/s (absolute)",
         f"{kernel_g / 1.2:.2f}x", ">= 1x", verdict(kernel_g >= 1.2)],
    ]
    if torch_g is not None:
        rows.append(["CPU kernel 1024x1280 fp32 vs eager PyTorch CPU, 1 thread",
                     f"{kernel_g:.3f} G elem/s",
                     f"PyTorch {torch_version} {torch_g:.3f} G elem/s",
                     f"{kernel_g / torch_g:.2f}x", ">= 4x",
                     verdict(kernel_g / torch_g >= 4)])
    else:
        rows.append(["CPU kernel 1024x1280 fp32 vs eager PyTorch CPU, 1 thread",
                     f"{kernel_g:.3f} G elem/s", "PyTorch: not installed",
                     "not measured", ">= 4x",
                     "not installed here: see "
                     "[benchmarks-gpu.md](benchmarks-gpu.md) and the notes"])
    rows.append(["(extra) same, vs numpy float32 in-process",
                 f"{kernel_g:.3f} G elem/s",
                 f"numpy {numpy_version} {numpy_g:.3f} G elem/s",
                 f"{kernel_g / numpy_g:.2f}x", "-", "-"])
    if gpu:
        for size in large_gpu_sizes(gpu):
            k, m = large_gpu(gpu, size)
            rows.append([f"CUDA kernel, {size} output, vs cudaMemset",
                         f"{k:.0f} GB/s", f"memset {m:.0f} GB/s",
                         f"{k / m:.2f}x", ">= 0.85x", verdict(k / m >= 0.85)])
        worst = None
        for b, e in sorted(gpu["batches"].items()):
            if e["torch_us"]:
                ratio = statistics.median(e["torch_us"]) / statistics.median(
                    e["temb_us"])
                worst = ratio if worst is None else min(worst, ratio)
        rows.append(["CUDA kernel vs eager PyTorch CUDA, batches 1..64 x320 "
                     "(worst)", "-", "PyTorch eager", fmt(worst) + "x"
                     if worst else "not measured", ">= 5x",
                     verdict(worst is not None and worst >= 5)])
    else:
        for what, goal in (("CUDA kernel, >= 256 MiB output, vs device write "
                            "bandwidth", ">= 0.85x"),
                           ("CUDA kernel vs eager PyTorch CUDA, batches "
                            "1..64", ">= 5x")):
            rows.append([what, "-", "-", "not measured", goal,
                         "no GPU in this run: see "
                         "[benchmarks-gpu.md](benchmarks-gpu.md)"])
    r.table(["target", "temb", "baseline (same run)", "ratio", "goal",
             "verdict"], rows)

    # Service tables.
    r.add("## Service: unary 1x320 fp32 (sdxl preset) against concurrency", "",
          f"![latency]({path.stem}/latency_vs_concurrency.png)", "")
    rows = []
    for c in concurrencies:
        for name in ("temb-server", "echo", "python"):
            x = latency[name][c]
            rows.append([c, name, f"{x['p50']:.0f}", f"{x['p90']:.0f}",
                         f"{x['p99']:.0f}", f"{x['rps']:.0f}",
                         x.get("failed", 0),
                         f"{x['p50'] / echo[c]['p50']:.2f}",
                         f"{x['rps'] / echo[c]['rps']:.2f}"])
    r.table(["concurrency", "server", "p50 us", "p90 us", "p99 us", "ok rps",
             "failed calls", "p50 / echo", "rps / echo"], rows)

    r.add("## Service: throughput against batch size (Nx320 fp32, "
          "concurrency 8)", "",
          f"![throughput]({path.stem}/throughput_vs_batch.png)", "")
    rows = []
    for b in batches:
        t, e, p = (per_batch[n][b] for n in ("temb-server", "echo", "python"))
        rows.append([b, f"{t:.0f}", f"{e:.0f}", f"{p:.0f}", f"{t / e:.2f}",
                     f"{t / p:.2f}"])
    r.table(["batch", "temb emb/s", "echo emb/s", "python emb/s",
             "temb / echo", "temb / python"], rows)

    r.add("## Service: large responses (Nx1280 fp32, concurrency 2, "
          "2 channels)", "")
    rows = []
    for b in sorted(large["echo"]):
        t, e, p = (large[n][b] / 2**20 for n in ("temb-server", "echo",
                                                  "python"))
        rows.append([f"{b}x1280 ({b * 1280 * 4 / 2**20:.0f} MiB)",
                     f"{t:.0f}", f"{e:.0f}", f"{p:.0f}", f"{t / e:.2f}",
                     f"{t / p:.2f}"])
    for b in sorted((large_stream or {}).get("echo", {})):
        t, e = (large_stream[n][b] / 2**20 for n in ("temb-server", "echo"))
        rows.append([f"{b}x1280 ({b * 1280 * 4 / 2**20:.0f} MiB), EmbedStream",
                     f"{t:.0f}", f"{e:.0f}", "-", f"{t / e:.2f}", "-"])
    r.table(["response", "temb MiB/s", "echo MiB/s", "python MiB/s",
             "temb / echo", "temb / python"], rows)

    # Kernels.
    r.add("## Kernels (CPU)", "",
          "`temb_kernel_benchmark` (bench/kernel_benchmark.cc, Google "
          "Benchmark) times `Backend::Compute` of the CPU backend for every "
          "engine this CPU runs, on the shapes diffusion pipelines use (1x320 "
          "and 64x320: an SD UNet step; 1024x1280 and 16384x1280: large "
          "batches at SDXL width), LDM spec, timesteps spread over [0, 1000); "
          "1024x1280-same-t: one timestep for every row, what a pipeline sends "
          "for one denoising step of a batch (each run of equal timesteps is "
          "computed once and copied). "
          "Memset and memcpy of the same output size run in the same process. "
          f"Medians of {kernel_reps} repetitions, G output elements/s "
          "(wall clock).", "")
    isas = []
    threads = set()
    for name in kernels:
        parts = name.split("/")
        if parts[0] == "Embed":
            if parts[1] not in isas:
                isas.append(parts[1])
            threads.add(int(parts[4].split(":")[1]))
    order = ["scalar", "sse2", "avx2", "avx512"]
    isas.sort(key=lambda i: order.index(i) if i in order else 99)
    best = isas[-1] if isas else None
    all_threads = max(threads) if threads else 1
    header = ["shape", "dtype", "memset", "memcpy"] + [
        f"{i} 1t" for i in isas]
    if all_threads > 1:
        header.append(f"{best} {all_threads}t")
    header.append(f"{best} 1t / memset")
    rows = []
    for shape in ("1x320", "64x320", "1024x1280", "16384x1280",
                  "1024x1280-same-t"):
        for dtype in ("fp32", "fp16", "bf16"):
            if shape.endswith("-same-t") and dtype != "fp32":
                continue
            memset = kernels.get(f"Memset/{dtype}/{shape}")
            row = [shape, dtype, fmt(memset), fmt(kernels.get(
                f"Memcpy/{dtype}/{shape}"))]
            row += [fmt(kernels.get(f"Embed/{i}/{dtype}/{shape}/threads:1"), 3)
                    for i in isas]
            if all_threads > 1:
                row.append(fmt(kernels.get(
                    f"Embed/{best}/{dtype}/{shape}/threads:{all_threads}"), 3))
            one = kernels.get(f"Embed/{best}/{dtype}/{shape}/threads:1")
            row.append(f"{100 * one / memset:.1f}%" if one and memset else
                       "n/a")
            rows.append(row)
    r.table(header, rows)
    kernel_sections(r, kernels, kernel_vs_torch, torch_version)

    if gpu:
        gpu_sections(r, gpu, path)

    for measured in sorted(MEASURED.glob("*.md")):
        r.add(measured.read_text().rstrip(), "")

    r.add("## Commands run", "", "```")
    for c in sorted(set(COMMANDS)):
        r.add(c)
    r.add("```", "")
    if NOTES.exists():
        r.add(NOTES.read_text().rstrip(), "")
    path.write_text(r.text())


if __name__ == "__main__":
    main()
